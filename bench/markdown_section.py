"""`--markdown` for every bench: run the bench as usual, its output going to stderr while it runs, then print to stdout
one Markdown section for docs/benchmarks.md: the bench's output as it printed it, with the machine, the date, the
commit and the command that made it.

    python bench/bench_refusals.py --markdown > section.md
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    """CPU model, cores, memory, Python and torch (when installed), e.g. for a bench's header line."""
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or platform.machine(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor() or platform.machine()
    )
    memory = ""
    if Path("/proc/meminfo").exists():
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        memory = f", {kib / 2**20:.0f} GiB"
    versions = f"Python {platform.python_version()}"
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        versions += f", torch {version('torch')}, ray {version('ray')}"
    return f"{cpu}, {os.cpu_count()} cores{memory}; {versions}"


def commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return (result.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


@contextlib.contextmanager
def section_if_asked(script: str):
    """Around a bench's main(): with ``--markdown`` in sys.argv (taken out before the bench parses its arguments),
    collect what it prints and print it at the end as a Markdown section."""
    if "--markdown" not in sys.argv[1:]:
        yield
        return
    sys.argv.remove("--markdown")
    name = Path(script).stem
    command = " ".join(["python", f"bench/{Path(script).name}", *sys.argv[1:]])
    started, load = time.monotonic(), os.getloadavg()[0]
    buffer, real = io.StringIO(), sys.stdout
    sys.stdout = _Tee(sys.stderr, buffer)
    try:
        yield
    finally:
        sys.stdout = real
        took = time.monotonic() - started
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        print(
            f"## {name}\n\n`{command}`\n\n- machine: {machine()}\n- date: {when}, commit {commit()}\n"
            f"- wall time: {took:.0f} s; 1-minute load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n\n"
            f"```text\n{buffer.getvalue().rstrip()}\n```\n"
        )
