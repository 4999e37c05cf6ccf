"""Layer names and the one ``--layers`` parser (the rule is LAYERS_HELP in raygeom/params.py)."""

from __future__ import annotations

import re

from raygeom.errors import RaygeomError


def select_layers(all_layers: list[str], selection: str) -> list[str]:
    """The layers a ``--layers`` value names (the rule is LAYERS_HELP in raygeom/params.py): ``all``, or
    comma-separated layer names, block numbers (``5`` is ``block_05``, ``-1`` the last block) and ``a:b``
    block ranges (blocks a to b-1, as Python slices). Integers count blocks only, so ``embed`` and
    ``final_norm`` (and any other named layer) are chosen by name."""
    if selection.strip() in ("", "all"):
        return list(all_layers)
    blocks = [name for name in all_layers if re.fullmatch(r"block_\d+", name)]
    by_number = {int(name[len("block_"):]): name for name in blocks}
    chosen: list[str] = []
    for part in (p.strip() for p in selection.split(",")):
        number = re.fullmatch(r"block_(\d+)", part)
        try:
            if part in all_layers:
                picks = [part]
            elif number:  # block_5 and block_005 both mean block_05
                picks = [by_number[int(number.group(1))]]
            elif ":" in part:
                start, _, stop = part.partition(":")
                picks = blocks[slice(int(start) if start else None, int(stop) if stop else None)]
                if not picks:
                    raise IndexError(part)
            else:
                picks = [blocks[int(part)]]
        except (ValueError, IndexError, KeyError):
            names = ", ".join(name for name in all_layers if name not in blocks)
            span = f"{len(blocks)} blocks (block numbers 0 to {len(blocks) - 1})" if blocks else "no blocks"
            raise RaygeomError(f"layer '{part}' not found: integers count blocks (5 = block_05, -1 = the last block, "
                               f"a:b = blocks a to b-1) and this model has {span}; other layers by name: {names}") from None
        chosen.extend(p for p in picks if p not in chosen)
    if not chosen:
        raise RaygeomError(f"layer selection '{selection}' picks none of this model's {len(all_layers)} layers")
    return sorted(chosen, key=all_layers.index)


def layer_names(n_blocks: int) -> list[str]:
    """The names model_surgery.layer_names gives a model with ``n_blocks`` blocks."""
    width = max(2, len(str(n_blocks - 1)))
    return ["embed", *[f"block_{i:0{width}d}" for i in range(n_blocks)], "final_norm"]
