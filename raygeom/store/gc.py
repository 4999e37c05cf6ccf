"""Free the activations no unit still needs (``raygeom gc STORE``).

An extraction's layer files are needed while a unit planned on it is not stored. The store knows which units were
planned on it: the engine records every unit it is handed in the extractions the unit reads (``_UNITS.json`` beside
the marker) before the unit runs. So the layer files of an extraction are freed when

- its completion marker and every file it lists are intact (a damaged extraction is left for ``raygeom verify``
  and the rerun that makes it again),
- the store holds its record of planned units, and
- every unit in that record has an intact result in ``results/``.

Its marker, per-sample table and the readout basis stay, so a rerun of those units reads them back and computes
nothing; a unit not run on it before extracts the layers again. Kept, with the reason: an extraction with a unit
not stored (an interrupted run, a layer the analysis refused, a damaged unit), one with no record (made by an
older raygeom, or never analysed) or a damaged one. The layer files of an interrupted extraction (no marker) are
freed too: whatever run needs it extracts it again from the start. The store's lock is held while files are
deleted, so no run is writing it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from raygeom.errors import RaygeomError
from raygeom.store.tree import UNITS_RECORD, Store, StoredExtraction, lock_store


@dataclass
class Verdict:
    extraction: StoredExtraction
    freed: bool  # freed (or, dry run, would be)
    reason: str
    files: int = 0  # layer files
    bytes: int = 0  # their bytes, with their checksum sidecars

    @property
    def label(self) -> str:
        settings = ((self.extraction.marker or {}).get("settings")) or {}
        shown = ", ".join(f"{name} {settings[name]}" for name in ("pool", "seq_len", "skip_first") if name in settings)
        n = (self.extraction.marker or {}).get("n_samples")
        what = ", ".join(part for part in (shown, f"n {n}" if n is not None else "") if part)
        key = self.extraction.key or "(no key)"
        return f"{self.extraction.model}@{self.extraction.revision} extraction {key}" + (f" ({what})" if what else "")


def _layer_files(extraction: StoredExtraction) -> list[Path]:
    return sorted(p for p in extraction.directory.glob("layer=*/*") if p.is_file())


def _unstored(store: Store, extraction: StoredExtraction) -> tuple[int, int] | str:
    """(units recorded, units not stored), or why there is nothing to go by."""
    record = store.planned_units(extraction.model, extraction.revision, extraction.marker["key"])
    if record is None:
        if (extraction.directory / UNITS_RECORD).is_file():
            return "its record of planned units is damaged (raygeom verify), so what it is needed for is not known"
        return "no record of the units planned on it (made by an older raygeom, or no unit was run on it)"
    planned = [(analysis, key) for analysis, keys in record.items() for key in keys]
    return len(planned), sum(1 for analysis, key in planned if not store.has_result(analysis, key))


def collect(root: str | Path, dry_run: bool = False) -> list[Verdict]:
    """Every extraction with layer files, freed (deleted unless ``dry_run``) or kept, with why."""
    store = Store(root)
    if not store.root.is_dir():
        raise RaygeomError(f"store {store.root} not found")
    if not dry_run:
        lock_store(store.root)
    verdicts = []
    for extraction in store.extractions():
        files = _layer_files(extraction)
        if not files:
            continue  # freed before, or never had layers
        if extraction.problem:
            verdict = Verdict(extraction, False, f"damaged: {extraction.problem}")
        elif extraction.marker is None:
            verdict = Verdict(extraction, True, "interrupted: no completion marker, so a run extracts it again from the start")
        else:
            problem = store.extraction_problem(extraction.model, extraction.revision, extraction.marker.get("key"))
            counted = None if problem else _unstored(store, extraction)
            if problem:
                verdict = Verdict(extraction, False, f"damaged: {problem}")
            elif isinstance(counted, str):
                verdict = Verdict(extraction, False, counted)
            elif counted[1]:
                verdict = Verdict(extraction, False, f"{counted[1]} of its {counted[0]} planned units not stored")
            else:
                verdict = Verdict(extraction, True, f"every one of its {counted[0]} planned units is stored")
        if verdict.freed:
            verdict.files = sum(1 for path in files if not path.name.startswith("."))
            verdict.bytes = sum(path.stat().st_size for path in files)
            if not dry_run:
                for layer_dir in sorted(extraction.directory.glob("layer=*")):
                    shutil.rmtree(layer_dir)
        verdicts.append(verdict)
    return verdicts
