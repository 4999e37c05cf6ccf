"""The wheel as a user installs it, without extras: built from this checkout, installed into a fresh venv, and run
from an empty folder as the `raygeom` console script: `--help`, and `raygeom pga` on a tiny model, with plotly,
matplotlib and tensorboardX absent. The core dependencies are not downloaded again: a .pth makes the test venv see a
folder of links to just the distributions the wheel requires (its METADATA's Requires-Dist, followed through this
venv's installed metadata), so a dependency the wheel forgot to declare fails here as it would for a user."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = {"plotly", "matplotlib", "tensorboardx"}


def _name(text: str) -> str:
    return text.lower().replace("_", "-").replace(".", "-")


def required_distributions(requires: list[str]) -> set[str]:
    """The installed distributions that ``requires`` (Requires-Dist lines, with their extras) pull, transitively."""
    seen: set[str] = set()
    todo = [(Requirement(line), "") for line in requires]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = _name(requirement.name)
        for wanted in ["", *sorted(requirement.extras)]:
            key = f"{name}[{wanted}]"
            if key in seen:
                continue
            seen.add(key)
            todo.extend((Requirement(line), wanted) for line in importlib.metadata.requires(name) or [])
    return {key.split("[")[0] for key in seen}


def link_distributions(names: set[str], folder: Path) -> None:
    """A site folder of symlinks to the top-level files and folders of ``names`` (and their .dist-info)."""
    folder.mkdir()
    for name in names:
        distribution = importlib.metadata.distribution(name)
        site = Path(distribution.locate_file(""))
        for top in {Path(str(file)).parts[0] for file in distribution.files or []}:
            source = site / top
            if source.exists() and not top.startswith("..") and top != "bin" and not (folder / top).exists():
                (folder / top).symlink_to(source)


def test_the_wheel_installs_and_runs_pga_without_the_extras(tmp_path, hub_cache):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(wheels.glob("raygeom-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    core = [line for line in requires if "extra ==" not in line]
    needed = required_distributions(core)
    assert not needed & EXTRAS_ONLY, f"a core dependency pulls {needed & EXTRAS_ONLY}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    link_distributions(needed, tmp_path / "core-site")
    (site / "core-dependencies.pth").write_text(f"{tmp_path / 'core-site'}\n")
    assert Path(sysconfig.get_paths()["purelib"]) != site

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", COLUMNS="200", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    raygeom = str(venv / "bin" / "raygeom")

    absent = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u, raygeom; print(raygeom.__file__, "
            "[m for m in ('plotly', 'matplotlib', 'tensorboardX') if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=empty,
        timeout=120,
    )
    assert absent.returncode == 0, absent.stderr
    assert absent.stdout.startswith(str(site)) and absent.stdout.rstrip().endswith("[]"), absent.stdout

    help_ = subprocess.run([raygeom, "--help"], capture_output=True, text=True, env=env, cwd=empty, timeout=120)
    assert help_.returncode == 0 and "pga" in help_.stdout, help_.stdout + help_.stderr

    corpus = empty / "texts.txt"
    from raygeom.testing import varied_text

    corpus.write_text("".join(f"item {i} {varied_text(i)}\n" for i in range(24)))
    result = subprocess.run(
        [
            raygeom,
            "pga",
            "--model",
            "EleutherAI/pythia-14m",
            "--revision",
            "step1000",
            "--corpus",
            "texts.txt",
            "--n-samples",
            "24",
            "--seq-len",
            "16",
            "--layers",
            "embed,-1",
            "--k",
            "4",
            "--n-null",
            "4",
            "--out",
            "out",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=empty,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Subspace PGA" in result.stdout and "block_02" in result.stdout
    assert (empty / "out" / "results" / "pga.parquet").is_file()
    assert not (empty / "out" / "report.html").exists() and not (empty / "out" / "plots").exists()
    assert "pip install 'raygeom[report]'" in result.stdout + result.stderr

    report = subprocess.run([raygeom, "report", "out"], capture_output=True, text=True, env=env, cwd=empty, timeout=120)
    assert report.returncode == 2 and report.stderr.strip().count("\n") == 0, report.stdout + report.stderr
    assert "the report needs the [report] extra: pip install 'raygeom[report]'" in report.stderr
