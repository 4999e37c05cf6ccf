"""Without a terminal (a log, a pipe) progress is plain lines: stage, units done and total, at most every 30 s."""

import io

from rich.console import Console
from rich.markup import escape

from raygeom.jobs.experiment import PLAIN_PROGRESS_SECONDS, PlainProgress, progress_bar


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_line_at_the_start_then_at_most_every_30_s_and_the_last_counts_at_the_end():
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, width=60)
    assert PLAIN_PROGRESS_SECONDS == 30.0 and isinstance(progress_bar(console), PlainProgress)
    with PlainProgress(console, clock=clock) as progress:
        extract = progress.add_task(f"extract {escape('[2 revisions]')}", total=160)  # as the drivers escape labels
        units = progress.add_task("pga, spectral 2 revisions", total=None)
        for second in range(1, 95):
            clock.now = float(second)
            progress.advance(extract, 1)
            if second == 40:
                progress.update(units, total=308)
            if second > 40:
                progress.advance(units, 2)
    lines = out.getvalue().splitlines()
    assert lines == [
        "progress 0:00:00  extract [2 revisions]: 0/160",  # the first stage, at once
        "progress 0:00:30  extract [2 revisions]: 30/160",
        "progress 0:00:30  pga, spectral 2 revisions: 0/?",
        "progress 0:01:00  extract [2 revisions]: 60/160",
        "progress 0:01:00  pga, spectral 2 revisions: 38/308",
        "progress 0:01:30  extract [2 revisions]: 90/160",
        "progress 0:01:30  pga, spectral 2 revisions: 98/308",
        "progress 0:01:34  extract [2 revisions]: 94/160",  # the end: each stage's last count
        "progress 0:01:34  pga, spectral 2 revisions: 108/308",
    ]


def test_a_terminal_gets_bars():
    from rich.progress import Progress

    assert isinstance(progress_bar(Console(file=io.StringIO(), force_terminal=True)), Progress)
