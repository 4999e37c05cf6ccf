"""Revisions a sweep could not fetch or extract, with the reason: ``raygeom status`` lists them, a rerun tries them
again and a revision that then lands leaves the list. One JSON file in the store, written atomically by the driver."""

from __future__ import annotations

import json
from pathlib import Path

from raygeom.store.tree import atomic_write_text

FAILED = "sweep/failed.json"


def read(root: str | Path) -> dict[str, dict]:
    """``model@revision`` -> {model, revision, reason}."""
    path = Path(root) / FAILED
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def record(root: str | Path, model: str, revision: str, reason: str) -> None:
    failed = read(root)
    failed[f"{model}@{revision}"] = {"model": model, "revision": revision, "reason": reason}
    _write(root, failed)


def clear(root: str | Path, model: str, revision: str) -> None:
    failed = read(root)
    if failed.pop(f"{model}@{revision}", None) is not None:
        _write(root, failed)


def _write(root: str | Path, failed: dict) -> None:
    path = Path(root) / FAILED
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json.dumps(failed, indent=1, sort_keys=True), path)
