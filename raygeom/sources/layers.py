"""Layer names and the one ``--layers`` parser (pure: no torch), shared by the CLI, job files and the Python API.

A model's layers, in depth order: ``embed`` (the first block's input), ``block_XX`` (each block's output) and
``final_norm``. Inside block XX, three hook points can be named too (see raygeom.sources.model_surgery)::

    block_XX.attn_out   what attention adds to the residual stream      (TransformerLens hook_attn_out)
    block_XX.resid_mid  the residual stream after attention's add       (hook_resid_mid)
    block_XX.mlp_out    what the MLP adds to the residual stream        (hook_mlp_out)

so that ``block_XX.resid_mid + block_XX.mlp_out == block_XX``. They are extracted only when named.
"""

from __future__ import annotations

import re

from raygeom.errors import RaygeomError

SUBLAYERS = ("attn_out", "resid_mid", "mlp_out")
# Where a point inside block i sits between the block's input (position i) and its output (position i + 1).
_OFFSET = {"attn_out": 0.25, "resid_mid": 0.5, "mlp_out": 0.75}
_BLOCK = re.compile(r"block_\d+")
INSIDE_POINT = re.compile(r"(.+)\.(attn_out|resid_mid|mlp_out)")


def split(name: str) -> tuple[str, str | None]:
    """``block_05.mlp_out`` -> (``block_05``, ``mlp_out``); any other name -> (name, None)."""
    found = INSIDE_POINT.fullmatch(name)
    return (found.group(1), found.group(2)) if found and _BLOCK.fullmatch(found.group(1)) else (name, None)


def position(all_layers: list[str], name: str) -> float:
    """Depth position of ``name`` in units of ``all_layers`` (the model's embed, blocks, final_norm list)."""
    block, sub = split(name)
    if sub is None:
        return float(all_layers.index(name))
    return all_layers.index(block) - 1 + _OFFSET[sub]


def index(all_layers: list[str], name: str) -> int:
    """The stored ``layer_index``: a layer's index in ``all_layers``; a point inside a block has its block's."""
    return all_layers.index(split(name)[0])


def relative_depth(all_layers: list[str], name: str) -> float:
    """0 at ``embed``, 1 at ``final_norm``; a point inside block i lies between block i's input and output."""
    return position(all_layers, name) / max(1, len(all_layers) - 1)


def _blocks_of(part: str, blocks: list[str], by_number: dict[int, str]) -> list[str]:
    number = re.fullmatch(r"block_(\d+)", part)
    if number:  # block_5 and block_005 both mean block_05
        return [by_number[int(number.group(1))]]
    if ":" in part:
        start, _, stop = part.partition(":")
        picks = blocks[slice(int(start) if start else None, int(stop) if stop else None)]
        if not picks:
            raise IndexError(part)
        return picks
    return [blocks[int(part)]]


def select_layers(all_layers: list[str], selection: str) -> list[str]:
    """The layers a ``--layers`` value names (the rule is LAYERS_HELP in raygeom/params.py): ``all``, or
    comma-separated layer names, block numbers (``5`` is ``block_05``, ``-1`` the last block) and ``a:b``
    block ranges (blocks a to b-1, as Python slices), each optionally followed by a point inside the block
    (``5.mlp_out``, ``block_05.resid_mid``, ``0:4.attn_out``). Integers count blocks only, so ``embed`` and
    ``final_norm`` (and any other named layer) are chosen by name. ``all`` is every layer but no point inside
    a block."""
    if selection.strip() in ("", "all"):
        return [name for name in all_layers if split(name)[1] is None]
    blocks = [name for name in all_layers if _BLOCK.fullmatch(name)]
    by_number = {int(name[len("block_") :]): name for name in blocks}
    chosen: list[str] = []
    for part in (p.strip() for p in selection.split(",")):
        inside = INSIDE_POINT.fullmatch(part)
        try:
            if part in all_layers:
                picks = [part]
            elif inside:
                picks = [f"{block}.{inside.group(2)}" for block in _blocks_of(inside.group(1), blocks, by_number)]
            else:
                picks = _blocks_of(part, blocks, by_number)
        except (ValueError, IndexError, KeyError):
            names = ", ".join(name for name in all_layers if name not in blocks and split(name)[1] is None)
            span = f"{len(blocks)} blocks (block numbers 0 to {len(blocks) - 1})" if blocks else "no blocks"
            raise RaygeomError(
                f"layer '{part}' not found: integers count blocks (5 = block_05, -1 = the last block, "
                f"a:b = blocks a to b-1) and this model has {span}; other layers by name: {names}; "
                f"inside a block: 5.attn_out, 5.resid_mid, 5.mlp_out"
            ) from None
        chosen.extend(p for p in picks if p not in chosen)
    if not chosen:
        raise RaygeomError(f"layer selection '{selection}' picks none of this model's {len(all_layers)} layers")
    return sorted(chosen, key=lambda name: position(all_layers, name))


def layer_names(n_blocks: int) -> list[str]:
    """The names model_surgery.layer_names gives a model with ``n_blocks`` blocks."""
    width = max(2, len(str(n_blocks - 1)))
    return ["embed", *[f"block_{i:0{width}d}" for i in range(n_blocks)], "final_norm"]
