"""The fenced code blocks of a Markdown file, for the tests that run the README's and CONTRIBUTING.md's code.
RAYGEOM_README names the file the README tests read (default README.md; a draft while it is written)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / os.environ.get("RAYGEOM_README", "README.md")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str, text: str | None = None) -> list[str]:
    """The bodies of the blocks fenced as ``language`` (of the README unless ``text`` is given)."""
    return [body for lang, body in BLOCK.findall(text if text is not None else README.read_text()) if lang == language]


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block, comments dropped and continuation lines joined, as argument lists."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]
