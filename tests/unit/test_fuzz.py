"""Property tests that attack (issue 41 item 9): every input to the job-file parser, the corpus readers,
write_activations and subspace_pga either works or is refused with one line (a RaygeomError), never a traceback,
and nothing stored or returned is a NaN where a number belongs.

Two hypothesis profiles: "short" (the default; about a minute in all, part of make test) and "long" (make fuzz, or
HYPOTHESIS_PROFILE=long), which runs each property for minutes."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from raygeom.errors import RaygeomError

COMMON = {
    "deadline": None,
    "derandomize": False,
    "database": None,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
}
settings.register_profile("short", max_examples=300, **COMMON)  # about 30 s in all here
# make fuzz must end within 10 minutes on this 2-core machine under the others' load (average 8-19): 8,000 took 8.5
# minutes for the first two properties alone, before every public function had its own property.
settings.register_profile("long", max_examples=2_500, **COMMON)  # about 7 minutes in all here
PROFILE = settings.get_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "short") if os.environ.get("HYPOTHESIS_PROFILE") in ("short", "long") else "short"
)
# The cheap properties (pure parsing) take more examples than the ones that write a store or score subspaces.
CHEAP = settings(PROFILE, max_examples=PROFILE.max_examples * 3)
# Each of the ~50 public functions: a few examples in the short profile (CI's test stays fast), 100 in the long.
EACH = settings(PROFILE, max_examples=max(3, PROFILE.max_examples // 25 if PROFILE.max_examples > 300 else 3))


def one_line(error: BaseException) -> str:
    text = str(error)
    assert isinstance(error, RaygeomError), f"{type(error).__name__}: {text}"
    assert text.strip() and "\n" not in text.strip() and "Traceback" not in text, text
    return text


# ---- the job-file parser, over the registry's declarations -------------------------------------------------------


def toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) else json.dumps(key)


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def declared_keys() -> dict[str, list[str]]:
    """Every section a job file may hold and the keys declared for it, from the declarations themselves."""
    from raygeom.analyses import registry
    from raygeom.analyses.train import TrainSettings
    from raygeom.jobspec import (
        SWEEP_KEYS,
        TRAIN_KEYS,
        CorpusSection,
        JobSection,
        SweepSettings,
        TrajectorySettings,
        WidthSettings,
    )
    from raygeom.params import PGAParams
    from raygeom.replica.settings import ExtractionSettings

    keys = {
        "job": [f.name for f in fields(JobSection)],
        "corpus": [f.name for f in fields(CorpusSection)],
        "extract": [f.name for f in fields(ExtractionSettings)] + ["layers"],
        "pga": [f.name for f in fields(PGAParams)],
        "sweep": sorted(SWEEP_KEYS) + [f.name for f in fields(SweepSettings)],
        "train": sorted(TRAIN_KEYS) + [f.name for f in fields(TrainSettings)],
        "trajectory": [f.name for f in fields(TrajectorySettings)],
        "width": [f.name for f in fields(WidthSettings)],
    }
    for name, analysis in registry.analyses().items():
        keys[f"analyses.{name}"] = [f.name for f in fields(analysis.Params)]
    return keys


KEYS = declared_keys()
SECTIONS = sorted(KEYS)
WORDS = st.sampled_from(
    [
        "k",
        "r",
        "n_null",
        "seed",
        "id",
        "out",
        "name",
        "foo",
        "analysis",
        "analyses",
        "layers",
        "revisions",
        "run_dir",
        "k_per_d",
        "x" * 300,
        "é",
        "a.b",
        "",
    ]
)
SCALARS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, 2, 3, -1, 10, 100, 2**31, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["", "all", "auto", "0,5,-1", "10:5", "embed", "x" * 300, "a\u0000b"]),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4), st.dictionaries(WORDS, SCALARS, max_size=2))


@st.composite
def job_files(draw) -> str:
    lines = []
    if draw(st.booleans()):
        lines += ["[[models]]", f"id = {toml_value(draw(st.sampled_from(['smollm2', 'EleutherAI/pythia-14m', '', 'x' * 300])))}"]
        if draw(st.booleans()):
            lines.append(f"revisions = {toml_value(draw(VALUES))}")
    for section in draw(st.lists(st.one_of(st.sampled_from(SECTIONS), WORDS.filter(bool)), max_size=4, unique=True)):
        known = KEYS.get(section, [])
        lines.append(f"[{'.'.join(toml_key(p) for p in section.split('.'))}]")
        for key in draw(st.lists(st.one_of(st.sampled_from(known), WORDS) if known else WORDS, max_size=4, unique=True)):
            lines.append(f"{toml_key(key)} = {toml_value(draw(VALUES))}")
    return "\n".join(lines) + "\n"


@CHEAP
@given(text=job_files())
def test_any_job_file_is_read_or_refused_in_one_line(text):
    from raygeom.jobspec import load_job
    from raygeom.params import check_value

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.toml"
        path.write_text(text)
        try:
            job = load_job(path)
        except RaygeomError as error:
            one_line(error)
            return
        except Exception as error:  # noqa: BLE001 - the property: nothing else escapes
            pytest.fail(f"{type(error).__name__}: {error}\n--- job file ---\n{text}")
    for planned in job.planned():  # what was read is within every declared range
        for spec in planned.params.declared():
            check_value(type(planned.params), spec.name, getattr(planned.params, spec.name))


# ---- corpus readers --------------------------------------------------------------------------------------------

JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20), st.lists(st.integers(), max_size=2)
)


@st.composite
def corpus_files(draw) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from([".txt", ".jsonl", ".parquet"]))
    how = draw(st.sampled_from(["bytes", "text", "structured"]))
    if how == "bytes":
        return suffix, draw(st.binary(max_size=300))
    if how == "text":
        text = "\n".join(draw(st.lists(st.text(max_size=30), max_size=8)))
        return suffix, text.encode(draw(st.sampled_from(["utf-8", "utf-16", "utf-32", "latin-1"])), errors="replace")
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        n = draw(st.integers(0, 6))
        columns = {}
        for name in draw(st.lists(st.sampled_from(["text", "label", "other"]), max_size=3, unique=True)):
            kind = draw(st.sampled_from(["str", "int", "null", "mixed"]))
            values = {
                "str": st.text(max_size=20),
                "int": st.integers(-5, 5),
                "null": st.none(),
                "mixed": st.one_of(st.none(), st.text(max_size=5)),
            }[kind]
            columns[name] = draw(st.lists(values, min_size=n, max_size=n))
        sink = pa.BufferOutputStream()
        try:
            pq.write_table(pa.table(columns) if columns else pa.table({"x": pa.array([], pa.int8())}), sink)
        except (pa.ArrowException, TypeError):
            return suffix, b""
        data = sink.getvalue().to_pybytes()
        if draw(st.booleans()):  # truncated or with a flipped byte
            cut = draw(st.integers(0, len(data)))
            data = (
                data[:cut]
                if draw(st.booleans())
                else data[:cut] + bytes([data[cut] ^ 0xFF]) + data[cut + 1 :]
                if cut < len(data)
                else data
            )
        return suffix, data
    records = draw(
        st.lists(
            st.one_of(JSON_VALUES, st.dictionaries(st.sampled_from(["text", "label", "x"]), JSON_VALUES, max_size=3)), max_size=6
        )
    )
    body = "\n".join(json.dumps(r) for r in records) if suffix == ".jsonl" else "\n".join(str(r) for r in records)
    return suffix, body.encode()


@CHEAP
@given(case=corpus_files(), n=st.integers(-2, 10), seed=st.integers(0, 3))
def test_any_corpus_file_is_read_or_refused_in_one_line(case, n, seed):
    from raygeom.sources.corpus import load_corpus

    suffix, data = case
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"corpus{suffix}"
        path.write_bytes(data)
        try:
            corpus = load_corpus(str(path))
            assert all(isinstance(t, str) and t.strip() for t in corpus.texts)
            assert corpus.labels is None or (
                len(corpus.labels) == len(corpus.texts) and all(isinstance(x, str) for x in corpus.labels)
            )
            if n >= 0:
                corpus.sample(n, seed)
        except RaygeomError as error:
            one_line(error)
        except Exception as error:  # noqa: BLE001
            pytest.fail(f"{type(error).__name__}: {error}\n--- {suffix} ---\n{data[:300]!r}")


# ---- write_activations and subspace_pga ------------------------------------------------------------------------

DTYPES = st.sampled_from([np.float16, np.float32, np.float64, np.int8, np.int64, np.bool_, np.complex64])


@st.composite
def matrices(draw, max_rows=40, max_cols=24):
    rows, cols = draw(st.integers(0, max_rows)), draw(st.integers(0, max_cols))
    kind = draw(st.sampled_from(["normal", "low rank", "repeated", "constant", "special", "3-D", "1-D"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    h = rng.standard_normal((rows, cols))
    if kind == "low rank" and rows and cols:
        h = rng.standard_normal((rows, 1)) @ rng.standard_normal((1, cols))
    elif kind == "repeated" and rows:
        h = np.repeat(h[: max(1, rows // 10)], 10, axis=0)[:rows] if rows >= 1 else h
    elif kind == "constant":
        h = np.ones((rows, cols))
    elif kind == "special" and h.size:
        h.flat[draw(st.integers(0, h.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e38, -1e38]))
    elif kind == "3-D":
        h = h.reshape(1, rows, cols)
    elif kind == "1-D":
        h = h.ravel()
    dtype = draw(DTYPES)
    with np.errstate(all="ignore"):
        return h.astype(dtype)


# Found by make fuzz: four rows on one line in float16, whose rounding lifts their numerical rank to 3, so the rank rule
# let them through; every 1-D null then ranks the distances alike (no spread) and z was NaN.
ON_A_LINE = np.array([[1.266, 0.7354, -0.957], [0.1191, 0.0692, -0.0901], [0.678, 0.394, -0.5127], [0.3984, 0.2316, -0.3015]])


@settings(PROFILE)
@given(
    h=matrices(),
    k=st.integers(-1, 12),
    r=st.integers(-1, 3),
    n_null=st.integers(0, 25),
    halves=st.sampled_from([0, 1, 2, 3]),
    readout=st.sampled_from(["full", "any"]),
    data=st.data(),
)
@example(h=ON_A_LINE.astype(np.float16), k=1, r=0, n_null=2, halves=0, readout="full", data=None)
def test_subspace_pga_scores_or_refuses_and_never_returns_a_noise_z(h, k, r, n_null, halves, readout, data):
    import raygeom

    w_u = np.random.default_rng(1).standard_normal((50, h.shape[-1] if h.ndim else 1))
    if readout == "any" and data is not None:  # W_U of low rank, zero, a few rows, another width or dtype
        w_u = data.draw(readouts(h.shape[-1] if h.ndim else 1), label="W_U")
    try:
        result = raygeom.subspace_pga(h, w_u, k=k, r=r, n_null=n_null, seed=0, text_halves=halves)
    except RaygeomError as error:
        one_line(error)
        return
    except Exception as error:  # noqa: BLE001
        pytest.fail(f"{type(error).__name__}: {error} (H {h.dtype} {h.shape}, k={k}, r={r}, n_null={n_null})")
    assert math.isfinite(result.z) and math.isfinite(result.rho_readout), result


@settings(PROFILE)
@given(
    h=matrices(max_rows=12, max_cols=10),
    texts=st.one_of(st.none(), st.lists(st.text(max_size=8), max_size=13)),
    model=st.sampled_from(["m", "org/m", "", "x" * 300, "a\u0000b", ".."]),
    layer=st.sampled_from(["embed", "block_00", "", "x" * 300]),
    readout=st.booleans(),
)
def test_write_activations_stores_finite_vectors_or_refuses_in_one_line(h, texts, model, layer, readout):
    from raygeom.store.activations import write_activations
    from raygeom.store.tree import Store

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "store"
        w_u = np.random.default_rng(2).standard_normal((20, h.shape[-1])) if readout and h.ndim >= 1 else None
        try:
            marker = write_activations(root, model=model, layer=layer, vectors=h, texts=texts, readout=w_u)
        except RaygeomError as error:
            one_line(error)
            return
        except Exception as error:  # noqa: BLE001
            pytest.fail(f"{type(error).__name__}: {error} (vectors {h.dtype} {h.shape}, model={model!r}, layer={layer!r})")
        stored = Store(root).read_layer(model, "main", layer, key=marker["key"])[1]
        assert stored.shape == h.shape and np.isfinite(stored).all()


# ---- every public function, every argument (issue 46 item 3) ----------------------------------------------------
# Each example corrupts up to two arguments of one public function (a hostile value of any type) and draws the others
# from values it takes, W_U included (full rank, low rank, zero, a few rows): the call returns a finite,
# correct-shaped result or raises a one-line RaygeomError, never another exception.

HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, 2, -1, 3.5, 2**32, 2**63 - 1, 1e308]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["", " ", "all", "x" * 300, "a\u0000b", "\ud800", "cpu", "cuda:9", "embed", "nowhere/x.gguf"]),
    st.lists(st.one_of(st.integers(-3, 5), st.text(max_size=3), st.none()), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-2, 3), max_size=2),
    matrices(max_rows=8, max_cols=6),
    st.builds(object),
)


@st.composite
def readouts(draw, d: int):
    """W_U for width ``d``: full rank, low rank, zero, a few rows, or any matrix (another d, dtype or shape)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    kind = draw(st.sampled_from(["full", "full", "low rank", "zero", "few rows", "any"]))
    if kind == "any":
        return draw(matrices(max_rows=30, max_cols=d + 1))
    rows = draw(st.integers(1, 6)) if kind == "few rows" else 40
    w_u = rng.standard_normal((rows, d))
    if kind == "low rank":
        rank = draw(st.integers(1, max(1, d - 1)))
        w_u = rng.standard_normal((rows, rank)) @ rng.standard_normal((rank, d))
    elif kind == "zero":
        w_u = np.zeros((rows, d))
    return w_u.astype(draw(st.sampled_from([np.float64, np.float32, np.float16])))


@st.composite
def layers_h(draw):
    """A layer H: usually N x d Gaussian (scorable), else any of matrices()."""
    if draw(st.booleans()):
        return draw(matrices(max_rows=30, max_cols=12))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return rng.standard_normal((draw(st.integers(3, 30)), draw(st.integers(2, 12))))


def width(h) -> int:
    return h.shape[-1] if getattr(h, "ndim", 0) else 1


@pytest.fixture(scope="module")
def tiny():
    if PROFILE.max_examples < settings.get_profile("long").max_examples:
        return None, None  # the short profile spares transformers' import (10-40 s here): the model is always hostile
    from raygeom.testing import tiny_bos_tokenizer, tiny_llama

    tokenizer = tiny_bos_tokenizer()
    return tiny_llama(len(tokenizer), seed=0, hidden_size=16, layers=2), tokenizer


@pytest.fixture(scope="module")
def store_root(tmp_path_factory):
    import raygeom

    root = tmp_path_factory.mktemp("fuzz") / "store"
    rng = np.random.default_rng(7)
    texts = [f"text {i}" for i in range(30)]
    vectors = {name: rng.standard_normal((30, 10)) for name in ("embed", "block_00", "block_01", "final_norm")}
    labels = [str(i % 3) for i in range(30)]
    raygeom.write_activations(
        root, model="m", vectors=vectors, texts=texts, labels=labels, readout=rng.standard_normal((50, 10)), n_blocks=2
    )
    return root


TEXTS = st.lists(st.sampled_from(["a cat", "the dog ran", "x", "numbers 1 2 3", "é ü", "a b c d e f g"]), min_size=1, max_size=4)
SELECTIONS = st.one_of(
    st.sampled_from(["all", "embed", "0", "-1", "0:2", "final_norm,0", "1.mlp_out", "7", "9:3", "foo"]),
    st.lists(st.sampled_from(["embed", "0", "-1", "block_01"]), max_size=3),
)
K = st.integers(-1, 12)


def api_arguments(name: str, data, tiny, store_root) -> dict:
    """Values each argument of ``name`` takes, drawn by ``data``: the valid draws of each argument."""
    draw = data.draw
    model, tokenizer = (st.just(value) if value is not None else HOSTILE for value in tiny)
    h = draw(layers_h(), label="h")
    common_pga = dict(
        k=K, r=st.integers(-1, 3), n_null=st.integers(0, 20), seed=st.integers(-1, 3), text_halves=st.sampled_from([0, 1, 2, 3])
    )
    return {
        "subspace_pga": dict(
            h=st.just(h), w_u=readouts(width(h)), readout=st.none(), device=st.sampled_from([None, "cpu"]), **common_pga
        ),
        "readout_basis": dict(w_u=readouts(draw(st.integers(1, 12))), k=K),
        "dispersion": dict(h=st.one_of(st.just(h), matrices(max_rows=8, max_cols=6))),
        "as_array": dict(
            x=st.one_of(matrices(max_rows=6, max_cols=4), st.lists(st.floats(), max_size=3)),
            dtype=st.sampled_from([np.float64, np.float32, np.int64, "float32"]),
            name=st.sampled_from(["H", "W_U"]),
        ),
        "select_layers": dict(
            all_layers=st.sampled_from([["embed", "block_00", "block_01", "final_norm"], ["embed", "block_00"], ["x"]]),
            selection=SELECTIONS,
        ),
        "load_texts": dict(
            source=st.sampled_from(["bbc", "nowhere.txt", ""]),
            n=st.one_of(st.none(), st.integers(-1, 50)),
            seed=st.integers(-1, 5),
        ),
        "load_model": dict(
            name=st.sampled_from(["", "nowhere/x.gguf", "/nonexistent-dir"]),
            revision=st.sampled_from([None, "main", ""]),
            device=st.sampled_from(["cpu", None, "cuda:3"]),
        ),
        "load_builtin": dict(name=st.sampled_from(["", "gpt2", "org/x", "x.gguf"]), device=st.sampled_from(["cpu", None])),
        "layer_names": dict(model=model),
        "unembedding_matrix": dict(model=model),
        "layer_activations": dict(
            model=model,
            tokenizer=tokenizer,
            texts=TEXTS,
            settings=st.sampled_from([None, "extraction"]),
            layers=st.one_of(st.none(), SELECTIONS),
            nll=st.booleans(),
        ),
        "pga_by_layer": dict(
            model=model,
            tokenizer=tokenizer,
            texts=st.lists(st.text(min_size=1, max_size=12), min_size=3, max_size=8),
            settings=st.sampled_from([None, "extraction"]),
            layers=SELECTIONS,
            **{**common_pga, "n_null": st.integers(0, 6), "text_halves": st.sampled_from([0, 2])},
        ),
        "store_pga": dict(
            store=st.just(store_root),
            model=st.sampled_from(["m", "other"]),
            revision=st.sampled_from(["main", "step1"]),
            layers=SELECTIONS,
            extraction=st.sampled_from([None, "nokey"]),
            **{**common_pga, "n_null": st.integers(0, 6), "text_halves": st.sampled_from([0, 2])},
        ),
        "store_analysis": dict(
            store=st.just(store_root),
            model=st.just("m"),
            revision=st.just("main"),
            analysis=st.sampled_from(["pga", "spectral", "pc1", "twonn", "sample_dispersion", "knn_lm", "nope"]),
            layers=SELECTIONS,
            extraction=st.none(),
            params=st.dictionaries(
                st.sampled_from(["k", "r", "seed", "level", "n_null", "text_halves", "x"]), st.integers(-1, 6), max_size=2
            ),
        ),
        "write_activations": dict(
            store=st.just(None),
            model=st.sampled_from(["m2", "org/m", ".."]),
            revision=st.sampled_from(["main", "step5"]),
            layer=st.sampled_from(["embed", "block_00", "x.y"]),
            vectors=st.one_of(st.just(h), matrices(max_rows=8, max_cols=6)),
            texts=st.one_of(st.none(), st.lists(st.text(max_size=5), min_size=0, max_size=31)),
            labels=st.one_of(st.none(), st.lists(st.sampled_from(["a", "b", 1]), max_size=31)),
            readout=st.one_of(st.none(), readouts(width(h))),
            n_blocks=st.one_of(st.none(), st.integers(-1, 4)),
            source=st.sampled_from([None, "mine"]),
            corpus=st.sampled_from([None, "bbc"]),
            settings=st.sampled_from([None, {"pool": "last"}]),
            step=st.one_of(st.none(), st.integers(-1, 5)),
        ),
        "write_report": dict(
            store_root=st.just(store_root), out=st.sampled_from([None, "report"]), overlay=st.sampled_from([(), [], ["nowhere"]])
        ),
        "ExtractionSettings": dict(
            seq_len=st.integers(-1, 600),
            pool=st.sampled_from(["last", "mean", "max"]),
            skip_first=st.booleans(),
            batch_size=st.integers(-1, 40),
        ),
    }[name]


def expected_result(name: str, result, kwargs: dict) -> None:
    """What a result that is not a refusal must be: finite numbers of the declared shape."""
    if name == "subspace_pga":
        assert math.isfinite(result.z) and math.isfinite(result.rho_readout) and result.k == kwargs["k"]
    elif name == "readout_basis":
        basis, values = result
        assert (
            basis.shape == (np.shape(kwargs["w_u"])[1], kwargs["k"])
            and np.isfinite(basis).all()
            and values.shape == (kwargs["k"],)
        )
    elif name == "dispersion":
        assert math.isfinite(result) and -1e-9 <= result <= 2 + 1e-9
    elif name == "as_array":
        assert isinstance(result, np.ndarray) and result.shape == np.shape(kwargs["x"])
    elif name in ("select_layers", "layer_names"):
        assert result and all(isinstance(layer, str) for layer in result)
    elif name == "load_texts":
        texts, labels = result
        assert all(isinstance(t, str) and t for t in texts) and (kwargs["n"] is None or len(texts) == kwargs["n"])
        assert labels is None or len(labels) == len(texts)
    elif name == "unembedding_matrix":
        assert result.ndim == 2 and np.isfinite(result).all()
    elif name == "layer_activations":
        pooled, nll = result
        assert all(v.shape[0] == len(kwargs["texts"]) and np.isfinite(v).all() for v in pooled.values())
        assert nll.shape == (len(kwargs["texts"]),) and (not kwargs["nll"] or np.isfinite(nll).all())
    elif name in ("pga_by_layer", "store_pga", "store_analysis"):
        assert isinstance(result, list) and all(isinstance(row, dict) for row in result)
        assert all(math.isfinite(row["z"]) or row.get("note") for row in result if "z" in row)
    elif name == "write_report":
        assert Path(result).is_file()


API_NAMES = sorted(n for n in __import__("raygeom").__all__ if n not in ("InputError", "RaygeomError", "PGAResult"))


def test_the_fuzz_knows_every_public_name():
    import raygeom

    assert set(API_NAMES) == set(raygeom.__all__) - {"InputError", "RaygeomError", "PGAResult"}  # PGAResult: a result


def call_public(function, name: str, kwargs: dict):
    import inspect

    positional = [p.name for p in inspect.signature(function).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    extra = kwargs.pop("params", {}) if name == "store_analysis" else {}
    if name == "as_array" or name == "select_layers":
        return function(*[kwargs[p] for p in positional if p in kwargs])
    return function(**kwargs, **extra)


@pytest.mark.parametrize("name", API_NAMES)
@EACH
@given(data=st.data())
def test_every_public_function_returns_a_finite_result_or_refuses_in_one_line(name, data, tiny, store_root, tmp_path_factory):
    import inspect

    import raygeom

    function = getattr(raygeom, name)
    valid = api_arguments(name, data, tiny, store_root)
    names = [p for p in inspect.signature(function).parameters if p not in ("self",)]
    names = [p if p != "params" or name != "store_analysis" else "params" for p in names]
    assert set(valid) == set(names), f"{name}: the fuzz draws {sorted(valid)}, the function takes {names}"
    spoilt = data.draw(st.sets(st.sampled_from(names), max_size=2), label="spoilt")
    hostile = {"params": st.dictionaries(st.sampled_from(["k", "r", "level", "x"]), HOSTILE, min_size=1, max_size=2)}  # **params
    kwargs = {p: data.draw(hostile.get(p, HOSTILE) if p in spoilt else valid[p], label=p) for p in names}
    if isinstance(kwargs.get("settings"), str) and kwargs["settings"] == "extraction":
        kwargs["settings"] = raygeom.ExtractionSettings(seq_len=16, batch_size=2)
    if name == "write_activations" and "store" not in spoilt:
        kwargs["store"] = tmp_path_factory.mktemp("w") / "store"
    if name == "write_report" and isinstance(kwargs.get("out"), str) and "out" not in spoilt:
        kwargs["out"] = tmp_path_factory.mktemp("r") / "report.html"
    shown = {
        p: (
            f"{type(v).__name__} {getattr(v, 'dtype', '')} {getattr(v, 'shape', '')}"
            if isinstance(v, np.ndarray)
            else repr(v)[:60]
        )
        for p, v in kwargs.items()
    }
    import contextlib

    with contextlib.chdir(tmp_path_factory.mktemp("cwd")):  # a relative path drawn (out="x") lands here
        try:
            result = call_public(function, name, dict(kwargs))
        except RaygeomError as error:
            one_line(error)
            return
        except Exception as error:  # noqa: BLE001 - the property: nothing else escapes
            pytest.fail(f"{name}: {type(error).__name__}: {error} ({shown})")
        expected_result(name, result, kwargs)


def _basis(rng, d: int, m: int) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((d, max(1, min(m, d)))))[0]


def numerics_arguments(name: str, data) -> dict:
    """Values each argument of ``raygeom.numerics.<name>`` takes, by the argument's name (the same name means the
    same thing in every public numerics function), with a few per function."""
    from raygeom.numerics import pga

    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**16), label="rng"))
    h = draw(layers_h(), label="h")
    d = width(h)
    n_values = draw(st.integers(0, 30), label="n values")
    values = rng.standard_normal(n_values)
    good = rng.standard_normal((20, 8))
    floats = st.floats(-3, 3)
    by_name = {
        "h": st.just(h),
        "w_u": readouts(d),
        "readout": st.one_of(st.none(), st.just(_basis(rng, d, 12))),
        "basis": st.one_of(st.just(_basis(rng, d, draw(st.integers(1, 12)))), st.just(rng.standard_normal((d, 3)))),
        "gram": st.one_of(
            st.just(good.T @ good), readouts(d).map(lambda w: w.T.astype(np.float64) @ w.astype(np.float64) if w.ndim == 2 else w)
        ),
        "x": st.just(values),
        "y": st.just(rng.standard_normal(n_values)),
        "a": st.just(values),
        "b": st.just(rng.standard_normal(n_values)),
        "values": st.just(values),
        "weights": st.one_of(st.none(), st.just(rng.integers(1, 4, n_values))),
        "nulls": st.just(values * 0.1),
        "rhos": st.just(values * 0.1),
        "data": st.just(values),
        "chunk": st.just(values),
        "clusters": st.one_of(st.none(), st.just(list(rng.integers(0, 4, n_values)))),
        "rho": floats,
        "rho_readout": floats,
        "z": st.one_of(st.none(), floats),
        "z_lo": floats,
        "z_hi": floats,
        "value": floats,
        "se": st.floats(0, 3),
        "null_std": st.one_of(st.none(), st.floats(0, 1)),
        "k": K,
        "r": st.integers(-1, 3),
        "seed": st.integers(-1, 3),
        "index": st.integers(0, 5),
        "d": st.integers(0, 12),
        "n": st.integers(0, 30),
        "size": st.integers(0, 30),
        "count": st.integers(0, 6),
        "successes": st.integers(0, 30),
        "n_boot": st.integers(0, 40),
        "level": st.floats(0, 1),
        "fraction": st.floats(0, 1),
        "cap": st.integers(0, 150),
        "block": st.integers(0, 120),
        "start": st.integers(0, 200),
        "min_null": st.integers(0, 200),
        "decide_cap": st.integers(0, 300),
        "n_null": st.integers(0, 12),
        "n_half": st.integers(0, 4),
        "n_subsamples": st.integers(0, 5),
        "target_half_width": st.floats(0, 2),
        "relative_target": st.one_of(st.none(), st.floats(0, 1)),
        "thresholds": st.lists(floats, max_size=3),
        "method": st.sampled_from(["fisher", "bootstrap", "x"]),
        "device": st.sampled_from([None, "cpu"]),
        "statistic": st.sampled_from([np.mean, np.median]),
        "draw": st.just(lambda indices: np.random.default_rng(len(indices)).normal(0.0, 0.1, len(indices))),
        "indices": st.lists(st.integers(0, 5), max_size=4),
    }
    per_function = {
        "pairwise_cosine_distances": {"x": st.one_of(st.just(h), st.just(good))},
        "ccr": {"h": st.one_of(st.just(h), st.just(good))},
        "summarize_null": {"rhos": st.just(values * 0.1)},
    }
    if name in ("null_rhos", "subspace_rho"):
        try:
            layer = pga.prepare_layer(good, 1)
        except RaygeomError:
            layer = None
        by_name["layer"] = st.just(layer)
        by_name["basis"] = st.just(_basis(rng, 8, draw(st.integers(1, 7))))
    return {**by_name, **per_function.get(name, {})}


def expected_numerics_result(name: str, result) -> None:
    """Arrays are finite; dicts and tuples hold numbers (NaN only where a function documents it: an interval that
    does not exist) or notes."""
    if isinstance(result, np.ndarray):
        assert np.isfinite(result).all() or name in ("average_ranks",), result
    elif isinstance(result, dict):
        assert all(isinstance(v, (int, float, str, np.integer, np.floating, bool, type(None))) for v in result.values()), result
    elif isinstance(result, tuple):
        assert all(isinstance(v, (float, int, np.ndarray, np.floating)) for v in result), result
    elif isinstance(result, float):
        assert not math.isinf(result), result


NUMERICS_NAMES = sorted(
    n
    for n in __import__("raygeom.numerics", fromlist=["__all__"]).__all__
    if n not in ("PGAResult", "PreparedLayer")  # results
)


@pytest.mark.parametrize("name", NUMERICS_NAMES)
@EACH
@given(data=st.data())
def test_every_public_numerics_function_returns_a_result_or_refuses_in_one_line(name, data):
    import inspect

    import raygeom.numerics as numerics

    function = getattr(numerics, name)
    valid = numerics_arguments(name, data)
    names = list(inspect.signature(function).parameters)
    assert set(names) <= set(valid), f"{name}: the fuzz draws no value for {sorted(set(names) - set(valid))}"
    spoilt = data.draw(st.sets(st.sampled_from(names), max_size=2), label="spoilt")
    kwargs = {p: data.draw(HOSTILE if p in spoilt else valid[p], label=p) for p in names}
    shown = {p: (f"ndarray {v.dtype} {v.shape}" if isinstance(v, np.ndarray) else repr(v)[:60]) for p, v in kwargs.items()}
    try:
        with np.errstate(all="ignore"):
            result = function(**kwargs)
    except RaygeomError as error:
        one_line(error)
        return
    except Exception as error:  # noqa: BLE001 - the property: nothing else escapes
        pytest.fail(f"{name}: {type(error).__name__}: {str(error)[:300]} ({shown})")
    expected_numerics_result(name, result)
