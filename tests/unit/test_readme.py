"""The README's code blocks against the CLI, without running anything: every `raygeom` line names a command and flags
that exist (the app's own click tree, as `--help` shows it), every command and flag of its CLI table exists, every
`make` target exists, the job file is one `load_job` accepts, the Python blocks compile, and the file stays under
15 KB. tests/integration/test_readme_run.py runs the blocks themselves on a tiny model. RAYGEOM_README points both
at another file (a draft)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import click
import pytest

from raygeom.cli import root
from tests.markdown_blocks import README, blocks, shell_commands

ROOT = Path(__file__).resolve().parents[2]


def raygeom_arguments(words: list[str]) -> list[str] | None:
    """The arguments after `raygeom` (or `python -m raygeom.cli`, `.venv/bin/raygeom`), wherever it starts."""
    for i, word in enumerate(words):
        if word == "raygeom" or word.endswith("/raygeom"):
            return words[i + 1 :]
        if word == "-m" and i + 1 < len(words) and words[i + 1] == "raygeom.cli":
            return words[i + 2 :]
    return None


def click_tree() -> click.Group:
    return root.app.click_command()


def options_of(command: click.Command) -> set[str]:
    return {name for parameter in command.params for name in (*parameter.opts, *parameter.secondary_opts)}


def check_line(arguments: list[str]) -> list[str]:
    """What is wrong with one raygeom command line: an unknown command or flag."""
    group = click_tree()
    if not arguments:
        return []
    command = group.get_command(None, arguments[0])
    if command is None:
        return [f"raygeom {arguments[0]}: no such command"]
    rest = arguments[1:]
    if isinstance(command, click.Group):
        command = command.get_command(None, rest[0]) if rest else command
        rest = rest[1:]
        if command is None:
            return [f"raygeom {arguments[0]} {arguments[1]}: no such command"]
    known = options_of(command) | {"--help"}
    return [
        f"raygeom {arguments[0]}: no flag {word.split('=')[0]}"
        for word in rest
        if word.startswith("--") and word.split("=")[0] not in known
    ]


def test_the_readme_is_under_15_kb():
    assert len(README.read_bytes()) < 15_000, f"{README.name} is {len(README.read_bytes())} bytes"


def test_the_checker_finds_an_unknown_command_and_flag():
    assert check_line(["pga", "--model", "x", "--k", "3"]) == []
    assert check_line(["pga", "--no-such-flag"]) == ["raygeom pga: no flag --no-such-flag"]
    assert check_line(["no-such-command"]) == ["raygeom no-such-command: no such command"]
    assert raygeom_arguments(shlex.split("ray job submit -- ~/venv/bin/python -m raygeom.cli run x.toml")) == ["run", "x.toml"]


def test_every_raygeom_line_names_commands_and_flags_that_exist():
    lines = [args for text in blocks("bash") for words in shell_commands(text) if (args := raygeom_arguments(words)) is not None]
    assert len(lines) >= 4
    wrong = [problem for args in lines for problem in check_line(args)]
    assert not wrong, wrong


def test_every_make_target_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = [words[1] for text in blocks("bash") for words in shell_commands(text) if words[0] == "make"]
    assert named and set(named) <= targets, set(named) - targets


def test_the_cli_table_names_commands_and_flags_that_exist():
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `raygeom ")]
    assert len(rows) >= 8
    wrong = []
    for row in rows:
        first, _, flags = [cell.strip() for cell in row.strip("|").split("|")]
        commands = [c.split()[1] for c in re.findall(r"`(raygeom [\w-]+)", first) if c.split()[1] != "NAME"]
        for command in commands:
            wrong += check_line([command])
        # issue 48: each flag of a row is one of every command the row names (the row for knn / train gave --steps,
        # which only train has); a group (analyze NAME) has the flags all its commands share
        for command in commands:
            found = click_tree().get_command(None, command)
            if found is None:
                continue
            known = (
                set.intersection(*(options_of(c) for c in found.commands.values()))
                if hasattr(found, "commands")
                else options_of(found)
            )
            wrong += [f"raygeom {command}: no flag {flag}" for flag in re.findall(r"`(--[\w-]+)`", flags) if flag not in known]
    assert not wrong, wrong


def test_the_cli_table_check_finds_a_flag_one_command_of_a_row_lacks(tmp_path, monkeypatch):
    draft = tmp_path / "README.md"
    draft.write_text(
        "\n".join(line for line in README.read_text().splitlines() if not line.startswith("| `raygeom "))
        + "\n| `raygeom knn` / `raygeom train` | kNN-LM; training | `--model`, `--steps` |\n" * 8
    )
    monkeypatch.setattr(sys.modules[__name__], "README", draft)
    with pytest.raises(AssertionError, match="raygeom knn: no flag --steps"):
        test_the_cli_table_names_commands_and_flags_that_exist()


def test_the_job_files_load_and_the_python_blocks_compile(tmp_path, monkeypatch):
    from raygeom.jobspec import load_job

    jobs = blocks("toml")
    assert jobs, "no job file in the README"
    for index, text in enumerate(jobs):
        path = tmp_path / f"job{index}.toml"
        path.write_text(text)
        job = load_job(path)
        assert job.analyses, "a README job should list [analyses.*]"
    for text in blocks("python"):
        compile(text, str(README), "exec")


@pytest.mark.parametrize(
    "text, expected", [("raygeom run a.toml \\\n  --out b  # c\n", [["raygeom", "run", "a.toml", "--out", "b"]])]
)
def test_shell_commands_join_continuations_and_drop_comments(text, expected):
    assert shell_commands(text) == expected
