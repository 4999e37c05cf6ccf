"""How fast bad input is refused, and what it leaves behind: one command, `python bench/bench_refusals.py`.

Each case is a real CLI run (a new Python process, as a user runs it) that must exit 2 with one line. Printed per
case: the median wall time of 3 runs, whether torch, transformers or ray was imported before the refusal, and
whether the run left its --out folder or a .lock anywhere under the working directory. Goal (issue 20): every
refusal < 1 s wall on this 2-core machine, none imports torch, none leaves anything behind.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from markdown_section import section_if_asked  # --markdown

ROOT = Path(__file__).resolve().parents[1]
# Runs the CLI as `raygeom` does, then reports which heavy modules the process had imported when it exited.
WRAPPER = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stderr.write('HEAVY=' + ','.join(m for m in ('torch', 'transformers', 'ray') "
    "if m in sys.modules) + '\\n'))\n"
    "sys.argv = ['raygeom', *sys.argv[1:]]\n"
    "from raygeom.cli.root import main\n"
    "main()\n"
)


def cases(work: Path) -> dict[str, list[str]]:
    model = work / "broken-model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64,')
    corpus = work / "texts.txt"
    corpus.write_text("\n".join(f"line number {i} of the corpus" for i in range(60)))
    job = work / "job.toml"
    job.write_text('[job]\nname = "x"\n[pga]\nk = 8\nbogus = 1\n')
    out = ["--out", str(work / "out")]
    return {
        "pga --k 0": ["pga", "--k", "0", *out],
        "pga --model <broken config.json>": ["pga", "--model", str(model), "--corpus", str(corpus), *out],
        "pga --model no-such-model": ["pga", "--model", "no-such-model", "--corpus", str(corpus), *out],
        "pga --corpus <missing file>": ["pga", "--corpus", str(work / "missing.txt"), *out],
        "run <job with an unknown key>": ["run", str(job), *out],
        "knn --temperature nan": ["knn", "--temperature", "nan", *out],
        "diagnose --ccr-ranks 1,x": ["diagnose", "--ccr-ranks", "1,x", *out],
        "dispersion --n-slices 0": ["dispersion", "--n-slices", "0", *out],
    }


def run_once(args: list[str], cwd: Path) -> tuple[float, int, list[str], str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - started
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    heavy = next((line.split("=", 1)[1] for line in lines if line.startswith("HEAVY=")), "?")
    errors = [line for line in lines if not line.startswith("HEAVY=")]
    return wall, done.returncode, errors, heavy


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Refusals: a new CLI process each, median of 3 runs")
    for column in ("case", "wall s", "exit", "stderr lines", "heavy imports", "left behind", "< 1 s"):
        table.add_column(column)
    worst = 0.0
    clean = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, args in cases(work).items():
            walls, outcome = [], None
            for _ in range(3):
                cwd = Path(tempfile.mkdtemp(dir=work, prefix="cwd-"))
                wall, code, errors, heavy = run_once(args, cwd)
                walls.append(wall)
                left = [p.name for p in (work / "out", *cwd.rglob("*.lock")) if p.exists()] + [p.name for p in cwd.iterdir()]
                outcome = (code, errors, heavy, left)
            code, errors, heavy, left = outcome
            median = statistics.median(walls)
            worst = max(worst, median)
            ok = code == 2 and len(errors) == 1 and not heavy and not left
            clean = clean and ok
            table.add_row(
                name,
                f"{median:.2f}",
                str(code),
                str(len(errors)),
                heavy or "none",
                ", ".join(left) or "nothing",
                "yes" if median < 1.0 else "NO",
            )
    console = Console(width=160)
    console.print(table)
    console.print(
        f"slowest refusal {worst:.2f} s (goal < 1 s); every case exit 2, one line, no torch/transformers/ray, "
        f"nothing left: {'yes' if clean else 'NO'}"
    )
    return 0 if clean and worst < 1.0 else 1


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each figure as it is measured, also into a pipe or a log
    with section_if_asked(__file__):
        code = main()
    sys.exit(code)
