"""A core install (no extras) has no plotly, matplotlib or tensorboardX: what needs one says, in one line, which extra
installs it. Here the three are hidden from importlib; tests/slow/test_wheel.py runs a real core install."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from raygeom import extras
from raygeom.cli import root
from raygeom.report.figures import plot_z_vs_depth

HIDDEN = ("plotly", "matplotlib", "tensorboardX")


@pytest.fixture
def core_install(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: None if name.split(".")[0] in HIDDEN else find_spec(name, *a, **k)
    )
    monkeypatch.setattr(extras, "_NOTED", set())
    extras.has.cache_clear()
    yield
    extras.has.cache_clear()


def _one_error_line(result, extra: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.output)
    assert f"pip install 'raygeom[{extra}]'" in lines[0] and f"[{extra}] extra" in lines[0]
    return lines[0]


def test_need_names_the_extra_of_a_missing_module(core_install):
    for module, extra in (("plotly", "report"), ("matplotlib", "report"), ("tensorboardX", "tensorboard")):
        with pytest.raises(extras.MissingExtra, match=rf"\[{extra}\] extra: pip install 'raygeom\[{extra}\]'"):
            extras.need(module)
    extras.has.cache_clear()


def test_report_without_the_report_extra_is_one_line_and_exit_2(core_install, tmp_path):
    line = _one_error_line(CliRunner().invoke(root.app, ["report", str(tmp_path)]), "report")
    assert "the report needs" in line
    assert not (tmp_path / "report.html").exists()


def test_export_without_the_tensorboard_extra_is_one_line_and_exit_2(core_install, tmp_path):
    result = CliRunner().invoke(root.app, ["export", str(tmp_path), "--tensorboard", str(tmp_path / "tb")])
    assert "export --tensorboard needs" in _one_error_line(result, "tensorboard")
    assert not (tmp_path / "tb").exists()


def test_a_plot_without_matplotlib_is_skipped_with_one_note(core_install, tmp_path, capsys):
    row = {"model": "m", "revision": "main", "k": 2, "r": 1, "relative_depth": 0.0, "z": 1.0}
    assert plot_z_vs_depth([row], tmp_path / "a.png") is None
    assert plot_z_vs_depth([row], tmp_path / "b.png") is None
    assert list(tmp_path.iterdir()) == []
    noted = capsys.readouterr().err.strip().splitlines()
    assert noted == ["note: no plots drawn: the plots need the [report] extra: pip install 'raygeom[report]'"]
