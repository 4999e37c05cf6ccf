"""Every relative link in every Markdown file of the repository points at a file or folder that exists."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def markdown_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(ROOT / name for name in listed if (ROOT / name).is_file())


def relative_links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # code blocks are not links
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = LINK.findall(text) + REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE) and not t.startswith("#")]


def test_the_link_finder_sees_links_and_skips_code_and_urls():
    text = '[a](docs/x.md) ![p](img/p.png "t") [w](https://e.org) [s](#top) `[c](nope.md)`\n```\n[d](nope2.md)\n```\n[r]: ref.md'
    assert relative_links(text) == ["docs/x.md", "img/p.png", "ref.md"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    dead = []
    base = ROOT if path.name == "README-draft.md" else path.parent  # the README's draft links as README.md will
    for target in relative_links(path.read_text()):
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        if file_part and not (base / file_part).exists():
            dead.append(target)
    assert dead == [], f"dead links in {path.relative_to(ROOT)}: {dead}"


SOURCE_PATH = re.compile(r"`((?:raygeom|tests|bench|jobs|docs)/[\w./-]+\.(?:py|toml|md|ipynb|yaml))`")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_source_files_named_in_the_docs_exist(path):
    # Modules move (the layout change of 2026-11-30 moved most of them); a doc naming the old path misleads.
    missing = [name for name in SOURCE_PATH.findall(path.read_text()) if not (ROOT / name).exists()]
    assert missing == [], f"{path.relative_to(ROOT)} names files that do not exist: {missing}"
