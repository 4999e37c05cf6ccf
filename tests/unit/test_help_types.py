"""--help says what each option takes, from its declaration: an integer option shows <int> (its value arrives as text,
which typer alone would show as <str>), and the top-level help says what `run` runs."""

import typer
from typer.testing import CliRunner

from raygeom.cli.root import app


def commands():
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        yield from ((f"{name} {sub}", c) for sub, c in getattr(command, "commands", {}).items())
        yield name, command


def test_numeric_options_show_their_type():
    checked = 0
    for name, command in commands():
        for param in command.params:
            text = getattr(param, "help", None) or ""
            for allowed, shown in (("Allowed: an integer", "<int"), ("Allowed: a number", "<float")):
                if allowed in text:
                    assert (param.metavar or "").startswith(shown), (name, param.opts, param.metavar)
                    checked += 1
    assert checked > 100


def test_the_top_level_help_says_what_run_runs():
    text = " ".join(CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output.split())
    assert "then Subspace PGA for every layer" not in text and "every analysis it names" in text
    pga = " ".join(CliRunner().invoke(app, ["pga", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "--n-samples -n <int>" in pga and "--n-null <int|auto>" in pga and "--pool <last|mean>" in pga
