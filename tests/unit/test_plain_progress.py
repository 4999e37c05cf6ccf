"""Without a terminal (a log, a pipe) progress is plain lines: stage, units done and total, at most every 30 s."""

import io

from rich.console import Console
from rich.markup import escape

from raygeom.jobs.progress import PLAIN_PROGRESS_SECONDS, PlainProgress, progress_bar


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_line_at_the_start_then_at_most_every_30_s_and_the_last_counts_at_the_end():
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, width=60)
    assert PLAIN_PROGRESS_SECONDS == 30.0 and isinstance(progress_bar(console), PlainProgress)
    with PlainProgress(console, clock=clock, heartbeat=False) as progress:
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
        "progress 0:00:30  extract [2 revisions]: 30/160",  # a stage whose total is not known yet is not shown
        "progress 0:01:00  extract [2 revisions]: 60/160",
        "progress 0:01:00  pga, spectral 2 revisions: 38/308",
        "progress 0:01:30  extract [2 revisions]: 90/160",
        "progress 0:01:30  pga, spectral 2 revisions: 98/308",
        "progress 0:01:34  extract [2 revisions]: 94/160",  # the end: each stage's last count
        "progress 0:01:34  pga, spectral 2 revisions: 108/308",
    ]


def test_a_stage_that_does_not_move_still_gets_a_line_every_interval():
    import time

    out = io.StringIO()
    with PlainProgress(Console(file=out, width=80), interval=0.2) as progress:
        progress.add_task("pga on 2 models", total=10)
        progress.advance(0, 3)
        time.sleep(1.5)  # nothing moves: the heartbeat speaks for it
    lines = out.getvalue().splitlines()
    assert lines[0] == "progress 0:00:00  pga on 2 models: 0/10", lines  # at once, when the first stage starts
    assert len(lines) >= 4 and all(line.endswith("pga on 2 models: 3/10") for line in lines[1:]), lines


def test_a_finished_stage_is_not_repeated_by_the_heartbeat():
    import time

    out = io.StringIO()
    with PlainProgress(Console(file=out, width=80), interval=0.2) as progress:
        progress.add_task("extract 2 models", total=4)
        progress.advance(0, 4)
        time.sleep(1.0)
    lines = out.getvalue().splitlines()
    assert lines[0] == "progress 0:00:00  extract 2 models: 0/4" and lines[1:] == [lines[1]], lines
    assert lines[1].endswith("extract 2 models: 4/4"), lines


def test_stages_keep_their_totals_and_count_a_repeated_pass_once():
    from raygeom.jobs.progress import Stages

    out = io.StringIO()
    with PlainProgress(Console(file=out, width=80), heartbeat=False) as progress:
        stages = Stages(progress)
        units = stages("diagnose m@main", 65)
        units.set_total(5)  # a group of the stage's units: the stage keeps its total
        units(65)
        later = stages("gap units", None)
        later.set_total(4)  # opened without a total: learns it
        later(4)
        first = stages("chunks pass, m@main", 15)
        first(15)
        again = stages("chunks pass, m@main", 15)  # another analysis reading the same pass back
        again(15)
        short = stages("knn pass, m@main", 12)
        short(10)  # the corpus gave fewer chunks than asked
        stages.close_opened()
    totals = {task.description: (task.completed, task.total) for task in progress.tasks}
    assert totals == {
        "diagnose m@main": (65, 65),
        "gap units": (4, 4),
        "chunks pass, m@main": (15, 15),
        "knn pass, m@main": (12, 12),
    }


def test_stage_words_say_models_or_revisions_as_the_case_is():
    from types import SimpleNamespace as Spec

    from raygeom.jobs.progress import pairs_words

    a0, a1, b0 = Spec(name="a", revision="step0"), Spec(name="a", revision="step1"), Spec(name="b", revision="step0")
    assert pairs_words([a0]) == "a@step0"
    assert pairs_words([a0, b0]) == "2 models"
    assert pairs_words([a0, a1]) == "2 revisions of a"
    assert pairs_words([a0, a1, b0]) == "3 (model, revision) pairs of 2 models"


def test_a_terminal_gets_bars():
    from rich.progress import Progress

    assert isinstance(progress_bar(Console(file=io.StringIO(), force_terminal=True)), Progress)
