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
settings.register_profile("long", max_examples=8_000, **COMMON)  # about 10 minutes in all here
PROFILE = settings.get_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "short") if os.environ.get("HYPOTHESIS_PROFILE") in ("short", "long") else "short"
)
# The cheap properties (pure parsing) take more examples than the ones that write a store or score subspaces.
CHEAP = settings(PROFILE, max_examples=PROFILE.max_examples * 3)


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
@given(h=matrices(), k=st.integers(-1, 12), r=st.integers(-1, 3), n_null=st.integers(0, 25), halves=st.sampled_from([0, 1, 2, 3]))
@example(h=ON_A_LINE.astype(np.float16), k=1, r=0, n_null=2, halves=0)
def test_subspace_pga_scores_or_refuses_and_never_returns_a_noise_z(h, k, r, n_null, halves):
    import raygeom

    w_u = np.random.default_rng(1).standard_normal((50, h.shape[-1] if h.ndim else 1))
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
