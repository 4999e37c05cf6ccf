"""A training run's directory as a sequence of checkpoints: the sweep source for a user's own training.

Layouts found, one checkpoint per sub-directory that holds a ``config.json`` (what ``save_pretrained``
writes), its step taken from the directory's name:

- ``checkpoint-N/`` (Hugging Face Trainer's ``output_dir``),
- ``stepN/``, ``step-N/``, ``step_N/`` (Pythia's revision names, and ``raygeom train``'s output).

Not a source: loose ``*.safetensors`` files with a step in their name (``model_step1000.safetensors``).
A bare weights file carries no config and no tokenizer, so the architecture would have to be guessed;
such a directory gets an error that says how to save loadable checkpoints instead.

Pure: file-system reads only, no torch, no Ray.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from raygeom.errors import RaygeomError

_NAME = re.compile(r"^(?:checkpoint-|step[-_]?)(\d+)$")
_LOOSE_WEIGHTS = re.compile(r"(?:step|checkpoint|iter|ckpt)[-_]?(\d+)", re.IGNORECASE)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# A run directory so named is named after its parent, so `runs/traj/checkpoints` is the model `traj`.
GENERIC_NAMES = {"checkpoints", "checkpoint", "ckpts", "ckpt", "output", "outputs"}


def step_of_name(name: str) -> int | None:
    """The step a checkpoint directory's name gives: ``checkpoint-500`` -> 500, ``step64`` -> 64, else None."""
    match = _NAME.match(name)
    return int(match[1]) if match else None


@dataclass(frozen=True)
class Checkpoint:
    label: str  # the directory's own name: the revision label in the store, tables and plots
    step: int
    path: Path


@dataclass(frozen=True)
class RunDirectory:
    root: Path
    checkpoints: tuple[Checkpoint, ...]  # in step order
    skipped: tuple[tuple[str, str], ...]  # (name, why) of step-named directories that are not loadable

    @property
    def name(self) -> str:
        return self.root.parent.name if self.root.name.lower() in GENERIC_NAMES else self.root.name

    def select(self, revisions) -> list[Checkpoint]:
        """``all`` (or the default ``main``): every checkpoint; otherwise labels (``checkpoint-500``) or
        steps (``step500`` / ``500``) naming checkpoints of this run."""
        wanted = [revisions] if isinstance(revisions, str) else list(revisions)
        if not wanted or all(w in ("all", "main") for w in wanted):
            return list(self.checkpoints)
        by_label = {c.label: c for c in self.checkpoints}
        by_step = {c.step: c for c in self.checkpoints}
        chosen: list[Checkpoint] = []
        for item in wanted:
            item = str(item)
            step = step_of_name(item) if step_of_name(item) is not None else (int(item) if item.isdigit() else None)
            found = by_label.get(item) or (by_step.get(step) if step is not None else None)
            if found is None:
                known = ", ".join(c.label for c in self.checkpoints[:6]) + (" ..." if len(self.checkpoints) > 6 else "")
                raise RaygeomError(f"run directory {self.root}: no checkpoint '{item}'; it has {known}")
            if found not in chosen:
                chosen.append(found)
        return sorted(chosen, key=lambda c: c.step)


def is_run_directory(path: str | Path) -> bool:
    """A directory without its own config.json whose sub-directories include step-named checkpoints."""
    path = Path(path).expanduser()
    if not path.is_dir() or (path / "config.json").is_file():
        return False
    return any(step_of_name(p.name) is not None and p.is_dir() for p in path.iterdir())


def has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in TOKENIZER_FILES)


def discover(path: str | Path) -> RunDirectory:
    """The checkpoints of a training run's directory, in step order; a clear error when there are none."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise RaygeomError(f"run directory not found: {path}")
    root = root.resolve()
    found: dict[int, Checkpoint] = {}
    skipped = []
    for child in sorted(root.iterdir()):
        step = step_of_name(child.name)
        if step is None or not child.is_dir():
            continue
        if not (child / "config.json").is_file():
            skipped.append((child.name, "no config.json (an interrupted save?)"))
            continue
        if step in found:
            raise RaygeomError(f"run directory {path}: {found[step].label} and {child.name} both claim step {step}")
        found[step] = Checkpoint(child.name, step, child)
    if not found:
        loose = sorted(p.name for p in root.glob("*.safetensors") if _LOOSE_WEIGHTS.search(p.stem))
        if loose:
            raise RaygeomError(
                f"{path} holds {len(loose)} weight files with a step in the name ({loose[0]}, ...) but no "
                "checkpoint directories; raygeom needs each checkpoint as a directory with config.json, "
                "e.g. save each with model.save_pretrained(f'{path}/step{step}')"
            )
        why = f" ({skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        raise RaygeomError(
            f"{path} holds no checkpoints: expected sub-directories checkpoint-N/ or stepN/ with a config.json{why}"
        )
    return RunDirectory(root, tuple(found[s] for s in sorted(found)), tuple(skipped))
