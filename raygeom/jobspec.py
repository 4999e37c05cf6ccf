"""TOML job files: what to run, validated before anything starts."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from raygeom.errors import RaygeomError
from raygeom.extract import ExtractionSettings
from raygeom.params import PGAParams


@dataclass(frozen=True)
class ModelEntry:
    source: str
    revisions: tuple[str, ...] = ("main",)


@dataclass(frozen=True)
class JobSpec:
    name: str
    out: str
    models: tuple[ModelEntry, ...]
    corpus: str = "bbc"
    n_samples: int = 500
    sample_seed: int = 0
    layers: str = "all"
    extraction: ExtractionSettings = field(default_factory=ExtractionSettings)
    pga: PGAParams = field(default_factory=PGAParams)

    def with_overrides(self, **overrides) -> "JobSpec":
        """Apply CLI options (None means 'not given') to the job, its extraction and PGA settings."""
        top, extraction, analysis = {}, {}, {}
        extraction_names = {f.name for f in fields(ExtractionSettings)}
        pga_names = {f.name for f in fields(PGAParams)}
        for name, value in overrides.items():
            if value is None:
                continue
            if name in extraction_names:
                extraction[name] = value
            elif name in pga_names:
                analysis[name] = value
            else:
                top[name] = value
        return replace(self, **top, extraction=replace(self.extraction, **extraction), pga=replace(self.pga, **analysis))


def _section(data: dict, name: str, path: Path) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise RaygeomError(f"{path}: [{name}] must be a table")
    return value


def _known(section: dict, allowed: set[str], where: str, path: Path) -> None:
    unknown = set(section) - allowed
    if unknown:
        raise RaygeomError(f"{path}: unknown key(s) in [{where}]: {', '.join(sorted(unknown))}")


def load_job(path: str | Path) -> JobSpec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RaygeomError(f"job file not found: {path}") from None
    except tomllib.TOMLDecodeError as error:
        raise RaygeomError(f"{path}: malformed TOML: {error}") from None
    _known(data, {"job", "models", "corpus", "extract", "pga", "sweep", "analysis", "dispersion"}, "top level", path)
    job = _section(data, "job", path)
    corpus = _section(data, "corpus", path)
    extract = _section(data, "extract", path)
    analysis = _section(data, "pga", path)
    _known(job, {"name", "out"}, "job", path)
    _known(corpus, {"name", "n_samples", "seed"}, "corpus", path)
    _known(extract, {"seq_len", "pool", "skip_first", "batch_size", "layers"}, "extract", path)
    _known(analysis, {f.name for f in fields(PGAParams)}, "pga", path)
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise RaygeomError(f"{path}: needs at least one [[models]] entry with an 'id'")
    entries = []
    for entry in models:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise RaygeomError(f"{path}: every [[models]] entry needs a string 'id'")
        _known(entry, {"id", "revisions"}, "models", path)
        revisions = entry.get("revisions", ["main"])
        if not isinstance(revisions, list) or not all(isinstance(r, str) for r in revisions) or not revisions:
            raise RaygeomError(f"{path}: 'revisions' of model {entry['id']} must be a non-empty list of strings")
        entries.append(ModelEntry(entry["id"], tuple(revisions)))
    try:
        layers = extract.pop("layers", "all")
        return JobSpec(
            name=str(job.get("name", path.stem)),
            out=str(job.get("out", f"runs/{path.stem}")),
            models=tuple(entries),
            corpus=str(corpus.get("name", "bbc")),
            n_samples=int(corpus.get("n_samples", 500)),
            sample_seed=int(corpus.get("seed", 0)),
            layers=str(layers),
            extraction=ExtractionSettings(**extract),
            pga=PGAParams(**analysis),
        )
    except (TypeError, ValueError) as error:
        raise RaygeomError(f"{path}: {error}") from None
