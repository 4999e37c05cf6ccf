"""Pythia as data: the 154 training checkpoints, the model sizes, the hub's known bad revisions,
and the checks that find revisions serving another revision's weights.

Pure Python: no Ray, no torch, no I/O.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from raygeom.errors import RaygeomError

FINAL_STEP = 143_000
LOG_STEPS = (0, *(2**i for i in range(10)))  # step0, step1, 2, 4, ..., 512
LINEAR_STEPS = tuple(range(1000, FINAL_STEP + 1, 1000))
PYTHIA_STEPS = LOG_STEPS + LINEAR_STEPS
PYTHIA_REVISIONS = tuple(f"step{s}" for s in PYTHIA_STEPS)


@dataclass(frozen=True)
class PythiaSize:
    name: str  # "14m", "1.4b", ...
    d: int
    n_blocks: int
    params: int  # total parameters, from the Pythia model cards

    @property
    def n_layers(self) -> int:
        """Layers raygeom extracts: embed, every block, final_norm."""
        return self.n_blocks + 2

    def weight_bytes(self, bytes_per_param: int = 2) -> int:
        return self.params * bytes_per_param


PYTHIA_SIZES = {
    s.name: s
    for s in (
        PythiaSize("14m", 128, 6, 14_067_712),
        PythiaSize("31m", 256, 6, 30_494_720),
        PythiaSize("70m", 512, 6, 70_426_624),
        PythiaSize("160m", 768, 12, 162_322_944),
        PythiaSize("410m", 1024, 24, 405_334_016),
        PythiaSize("1b", 2048, 16, 1_011_781_632),
        PythiaSize("1.4b", 2048, 24, 1_414_647_808),
        PythiaSize("2.8b", 2560, 32, 2_775_208_960),
        PythiaSize("6.9b", 4096, 32, 6_857_302_016),
        PythiaSize("12b", 5120, 36, 11_846_072_320),
    )
}

# What the hub is known to serve wrongly (github.com/EleutherAI/pythia issues). Fingerprints decide;
# these notes only say where to look and are printed next to what the fingerprints find.
KNOWN_BAD = (
    ("*", "step1", "EleutherAI/pythia#83: step0 and step1 serve the same weights"),
    ("2.8b", "early", "EleutherAI/pythia#195, #205: many early pythia-2.8b revisions serve final-era weights"),
    ("12b", "step50000", "EleutherAI/pythia#206: serves the final model's first shard"),
    ("12b", "step58000", "EleutherAI/pythia#206: serves the final model's first shard"),
)

_REPO = re.compile(r"^EleutherAI/pythia-(?P<size>[0-9.]+[mb])(?P<deduped>-deduped)?(?P<v0>-v0)?$")


def repo_id(size: str, deduped: bool = False) -> str:
    if size not in PYTHIA_SIZES:
        raise RaygeomError(f"unknown Pythia size '{size}'; known: {', '.join(PYTHIA_SIZES)}")
    return f"EleutherAI/pythia-{size}{'-deduped' if deduped else ''}"


def size_of(repo: str) -> PythiaSize | None:
    match = _REPO.match(repo)
    return PYTHIA_SIZES.get(match["size"]) if match else None


def step_of(revision: str) -> int | None:
    if revision == "main":
        return FINAL_STEP
    match = re.fullmatch(r"step(\d+)", revision)
    return int(match[1]) if match else None


def expand_revisions(selection: str | list[str]) -> list[str]:
    """``all`` (154), ``log`` (step0 to step512), ``linear`` (every 1000), ``every:N`` (every N-th of
    the linear ones plus all log ones), ``stepA:stepB`` (the Pythia revisions in that range), or a list."""
    if isinstance(selection, list):
        revisions = []
        for item in selection:
            revisions += [r for r in expand_revisions(item) if r not in revisions]
        return revisions
    if not isinstance(selection, str):
        raise RaygeomError(f"revisions must be all, log, linear, every:N, stepA:stepB or a list of these, got {selection!r}")
    text = selection.strip()
    if text == "all":
        return list(PYTHIA_REVISIONS)
    if text == "log":
        return [f"step{s}" for s in LOG_STEPS]
    if text == "linear":
        return [f"step{s}" for s in LINEAR_STEPS]
    if text.startswith("every:"):
        try:
            every = int(text.split(":", 1)[1])
        except ValueError:
            every = 0
        if every <= 0:
            raise RaygeomError(f"revision selection '{text}': N in every:N must be a positive integer")
        linear = [s for s in LINEAR_STEPS if (s // 1000) % every == 0 or s == FINAL_STEP]
        return [f"step{s}" for s in LOG_STEPS + tuple(linear)]
    if ":" in text and text.count(":") == 1:
        low, high = (step_of(part) for part in text.split(":"))
        if low is None or high is None or low > high:
            raise RaygeomError(f"revision range '{text}' must look like step1000:step143000")
        return [f"step{s}" for s in PYTHIA_STEPS if low <= s <= high]
    if step_of(text) is None:
        raise RaygeomError(f"revision '{text}' is not stepN, main, all, log, linear, every:N or stepA:stepB")
    return [text]


def known_bad_note(repo: str, revision: str) -> str | None:
    size = size_of(repo)
    step = step_of(revision)
    for where, which, note in KNOWN_BAD:
        if size is None or (where != "*" and where != size.name):
            continue
        if which == revision or (which == "early" and step is not None and step < 1000):
            return note
    return None


def gpus_per_model(
    params: int, gpu_memory_gib: float, gpus_per_node: int, bytes_per_param: int = 2, headroom: float = 1.3
) -> float:
    """GPUs one replica asks Ray for: 0.5 when two replicas fit one GPU (the next revision loads while
    the current one runs), 1 when one fits, else the whole GPUs it must be sharded over."""
    need = params * bytes_per_param * headroom / 2**30
    if gpu_memory_gib <= 0:
        raise RaygeomError("gpu_memory_gib must be positive")
    if need <= gpu_memory_gib / 2:
        return 0.5
    if need <= gpu_memory_gib:
        return 1.0
    gpus = math.ceil(need / gpu_memory_gib)
    if gpus > gpus_per_node:
        raise RaygeomError(
            f"a model of {params / 1e9:.1f}B parameters needs {gpus} GPUs of {gpu_memory_gib} GiB, "
            f"more than the {gpus_per_node} of one node"
        )
    return float(gpus)


def _order(steps: dict[str, int | None] | None):
    step = (lambda r: steps.get(r)) if steps is not None else step_of
    return lambda r: (step(r) if step(r) is not None else -1, r)


def duplicate_groups(fingerprints: dict[str, str], steps: dict[str, int | None] | None = None) -> list[list[str]]:
    """Revisions (in step order; ``steps`` gives each revision's step, else its Pythia name does) that share
    a whole-model weight fingerprint, groups of two or more."""
    groups: dict[str, list[str]] = {}
    for revision, fingerprint in fingerprints.items():
        groups.setdefault(fingerprint, []).append(revision)
    order = _order(steps)
    return sorted((sorted(g, key=order) for g in groups.values() if len(g) > 1), key=lambda g: order(g[0]))


def shared_tensors(
    tensors: dict[str, dict[str, str]], threshold: float = 0.1, steps: dict[str, int | None] | None = None
) -> dict[str, tuple[str, float]]:
    """Revisions that share at least ``threshold`` of their tensors (by per-tensor fingerprint) with another
    revision without being identical: a mixed checkpoint such as one serving another's first shard.
    Returns revision -> (the other revision, fraction of tensors shared)."""
    found: dict[str, tuple[str, float]] = {}
    revisions = sorted(tensors, key=_order(steps))
    index: dict[tuple[str, str], list[str]] = {}
    for revision in revisions:
        for name, digest in tensors[revision].items():
            index.setdefault((name, digest), []).append(revision)
    for revision in revisions:
        counts: dict[str, int] = {}
        for name, digest in tensors[revision].items():
            for other in index[(name, digest)]:
                if other != revision:
                    counts[other] = counts.get(other, 0) + 1
        total = max(1, len(tensors[revision]))
        partial = {o: c / total for o, c in counts.items() if threshold <= c / total < 1.0}
        if partial:
            other = max(partial, key=lambda o: (partial[o], o))
            found[revision] = (other, partial[other])
    return found
