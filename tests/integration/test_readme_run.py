"""The README's quick start and Python API, run as a reader runs them: the job file saved as first.toml, the
`raygeom plan/run/report` lines of its block run from that folder, then its pandas block and its API block. Two
substitutions keep them cheap and offline: the tiny offline Pythia in place of SmolLM2, and `run` attached to the
session's Ray (--address). The cluster block's `ray` lines are checked against Ray's own CLI (tests/unit/test_readme.py
checks every `raygeom` line against the app's). RAYGEOM_README points it at another file (a draft)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.markdown_blocks import README, blocks, shell_commands

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = 'id = "EleutherAI/pythia-14m"\nrevisions = ["step1000"]'
TINY_LOAD = 'raygeom.load_model("EleutherAI/pythia-14m", revision="step1000")'


def _one(candidates: list[str], marker: str) -> str:
    found = [text for text in candidates if marker in text]
    assert len(found) == 1, f"expected one block with {marker!r} in {README.name}, found {len(found)}"
    return found[0]


def test_the_quick_start_and_the_api_run_on_a_tiny_model(tmp_path, hub_cache, ray_address):
    job = _one(blocks("toml"), "[analyses.")
    assert 'id = "smollm2"' in job
    (tmp_path / "first.toml").write_text(job.replace('id = "smollm2"', TINY_MODEL))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}

    commands = [words for words in shell_commands(_one(blocks("bash"), "first.toml")) if words[0] == "raygeom"]
    assert [words[1] for words in commands] == ["plan", "run", "report"]
    for words in commands:
        extra = ["--address", ray_address] if words[1] == "run" else []
        result = subprocess.run(
            [sys.executable, "-m", "raygeom.cli", *words[1:], *extra],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=600,
        )
        assert result.returncode == 0, f"{' '.join(words)}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    store = tmp_path / "runs" / "first"
    assert (store / "report.html").is_file()
    for name in ("pga", "spectral", "twonn"):
        assert pq.read_table(store / "results" / f"{name}.parquet").num_rows == 5, name  # embed, 3 blocks, final norm

    pandas_block = _one(blocks("python"), "read_parquet")
    read = subprocess.run(
        [sys.executable, "-c", pandas_block], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert read.returncode == 0, read.stderr[-3000:]
    assert "z_lo" in read.stdout and "block_02" in read.stdout and "twonn_mle" in read.stdout

    api = _one(blocks("python"), "import raygeom\n")
    assert 'raygeom.load_builtin("smollm2")' in api
    run_api = subprocess.run(
        [sys.executable, "-c", api.replace('raygeom.load_builtin("smollm2")', TINY_LOAD)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert run_api.returncode == 0, run_api.stdout[-3000:] + run_api.stderr[-3000:]
    assert "z = " in run_api.stdout and "95 % interval" in run_api.stdout
    mine = tmp_path / "runs" / "mine"
    assert (mine / "report.html").is_file()
    # one unit file per layer (embed, block_01, block_02); the tiny model's embed layer of 60 texts has not the rank
    # PGA needs, so PGA shows it with its reason and stores the two blocks
    assert len(list((mine / "results" / "twonn").glob("*.parquet"))) == 3
    assert len(list((mine / "results" / "pga").glob("*.parquet"))) >= 2


def test_the_ray_lines_use_commands_and_flags_that_exist():
    import click
    from ray.scripts.scripts import cli

    lines = [words for text in blocks("bash") for words in shell_commands(text) if words[0] == "ray"]
    assert lines, f"no ray line in {README.name}"
    for words in lines:
        command, rest = cli, words[1:]
        while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
            command, rest = command.get_command(None, rest[0]), rest[1:]
            assert command is not None, " ".join(words)
        rest = rest[: rest.index("--")] if "--" in rest else rest
        known = {name for parameter in command.params for name in (*parameter.opts, *parameter.secondary_opts)}
        assert not [w for w in rest if w.startswith("-") and w.split("=")[0] not in known], " ".join(words)
