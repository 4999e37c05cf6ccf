"""Help keeps its words (issue 48 §3): typer renders help texts as rich markup, where ``[analyses.<name>]`` or
``[[models]]`` is a tag that vanishes. Every command's --help (the whole command tree walked) shows each help text
as declared, square brackets included; a printed path keeps its brackets; ranges print whole numbers one way."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from raygeom.cli.root import app


def _tree(command, path=()):
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _tree(sub, (*path, name))


def _plain(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def _declared(text: str) -> str:
    """The help text as written in the source (the tree holds it escaped for rich)."""
    return _plain(text.replace("\\[", "["))


def test_every_help_text_keeps_its_square_brackets():
    root = typer.main.get_command(app)
    runner, checked, bracketed = CliRunner(), 0, 0
    for path, command in _tree(root):
        shown = _plain(runner.invoke(app, [*path, "--help"], env={"COLUMNS": "3000"}).output)
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        texts += [sub.help or "" for sub in getattr(command, "commands", {}).values()]
        for text in filter(None, texts):
            declared = _declared(text)
            checked += 1
            if "[" in declared:
                bracketed += 1
                for token in re.findall(r"\[[^\]]*\]+", declared):
                    assert token in shown, (path, token, declared)
            assert declared[:60] in shown, (path, declared[:60])
    assert checked > 300 and bracketed >= 3


def test_the_two_texts_the_issue_names():
    top = _plain(CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"}).output)
    assert "every analysis it names ([analyses.<name>]; Subspace" in top
    train = _plain(CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "300"}).output)
    assert "A sweep source: [[models]] run_dir" in train


def test_seed_ranges_print_whole_numbers_in_full():
    texts = [p.help or "" for _, c in _tree(typer.main.get_command(app)) for p in c.params]
    assert not [t for t in texts if "e+0" in t]
    assert any("4,294,967,295" in t for t in texts)


def test_a_bracketed_store_path_prints_whole(tmp_path, monkeypatch):
    """`raygeom report 'runs[final]'` and the report line ending a run print the path where the file is."""
    from io import StringIO

    from rich.console import Console

    from raygeom.report import html

    store = tmp_path / "runs[final]"
    store.mkdir()

    def written(root, out=None, overlay=()):
        page = Path(root) / "report.html"
        page.write_text("<html></html>")
        return page

    monkeypatch.setattr(html, "write_report", written)
    shown = CliRunner().invoke(app, ["report", str(store)], env={"COLUMNS": "3000"})
    assert shown.exit_code == 0, shown.output
    assert f"report: {store / 'report.html'} (" in shown.output

    stream = StringIO()
    html.announce_report(store, Console(file=stream, width=3000))
    assert f"report:  {store / 'report.html'}" in stream.getvalue()


def test_status_and_plan_titles_keep_their_brackets(tmp_path, monkeypatch):
    from raygeom.analyses import train

    monkeypatch.setattr(train, "estimate_training_seconds", lambda *args, **kwargs: 60.0)  # no timing steps here
    folder = tmp_path / "jobs[x]"
    folder.mkdir()
    job = folder / "job.toml"
    job.write_text(
        "[job]\nout = 'runs[final]'\n[[models]]\nid = 'smollm2'\n[corpus]\nname = 'bbc'\nn_samples = 50\n[pga]\nk = 8\n"
    )
    shown = CliRunner().invoke(app, ["status", str(job)], env={"COLUMNS": "3000"})
    assert shown.exit_code == 0, shown.output
    # the title as printed, however the console (made at import, its width fixed then) wrapped it
    assert f"Status job ({folder / 'runs[final]'})" in " ".join(shown.output.split())
    trajectory = Path(__file__).resolve().parents[2] / "jobs" / "trajectory.toml"
    assert "Plan trajectory: [train] runs" in CliRunner().invoke(app, ["plan", str(trajectory)], env={"COLUMNS": "3000"}).output
