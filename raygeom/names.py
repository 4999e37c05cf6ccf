"""Names that become file names: refused in one line when the filesystem cannot hold them (before any work),
instead of an ``OSError: [Errno 36] File name too long`` traceback from deep inside a run."""

from __future__ import annotations

import os

from raygeom.errors import RaygeomError

NAME_MAX = 255  # bytes of one path component (Linux, macOS, ext4, xfs, APFS, NTFS in UTF-16 units)
PATH_MAX = 4096  # bytes of a whole path (Linux)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:40] + "..." + text[-12:])


def check_path(value, what: str) -> str:
    """``value`` (a path a file or directory will be made at or read from) if the filesystem can hold it."""
    text = os.fspath(value)
    if "\0" in text:
        raise RaygeomError(f"{what} {_shown(text)} contains a NUL character, which no file name can hold")
    size = len(os.fsencode(text))
    if size >= PATH_MAX:
        raise RaygeomError(f"{what} is {size:,} bytes long; a path can be at most {PATH_MAX - 1:,} ({_shown(text)})")
    for part in text.split(os.sep):
        if len(os.fsencode(part)) > NAME_MAX:
            raise RaygeomError(
                f"{what} {_shown(text)} has a component of {len(os.fsencode(part)):,} bytes; a file "
                f"name can be at most {NAME_MAX}"
            )
    return text


def check_segment(segment: str, what: str, prefix: str = "") -> str:
    """One path segment the store makes from a name (``prefix`` + the encoded name), if it fits a file name."""
    if len(os.fsencode(prefix + segment)) > NAME_MAX:
        raise RaygeomError(
            f"{what} {_shown(segment)} is too long to be stored: {len(os.fsencode(segment)):,} bytes once "
            f"encoded, at most {NAME_MAX - len(prefix)}"
        )
    return segment
