"""docs/sweeps.md's `ray job submit` recipe, run as written against a loopback head started *outside* the venv
(PATH without it, as when `ray start` ran from another shell): the entrypoint names the venv's interpreter, the head
has its own --temp-dir and the recipe's last line stops that head and no other Ray; the job's log keeps the full
layer names of the table (it is not a terminal)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_faults import processes_under as processes_naming

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def documented_recipe() -> str:
    text = (ROOT / "docs" / "sweeps.md").read_text()
    found = re.search(r"<!-- recipe: job-submit -->\n```bash\n(.*?)```", text, re.DOTALL)
    assert found, "docs/sweeps.md lost its job-submit recipe"
    return found.group(1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def long_lived(pid: int) -> bool:
    try:
        return any(name in Path(f"/proc/{pid}/cmdline").read_bytes() for name in (b"gcs_server", b"raylet"))
    except OSError:
        return False


def test_the_documented_job_submit_recipe_runs_with_a_head_started_outside_the_venv(hub_cache, ray_local, tmp_path):
    recipe = documented_recipe()
    out = tmp_path / "out"
    # What a test must change: this checkout's venv, free ports (this session's own Ray holds the defaults), the
    # offline hub cache of tiny models, and the output directory.
    agent_ports = " ".join(f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                                  "runtime-env-agent-port", "metrics-export-port",
                                                                  "ray-client-server-port"))
    dashboard = free_port()
    script = (recipe.replace("VENV=$PWD/.venv", f"VENV={sys.prefix}")
              .replace("--port=6390", f"--port={free_port()}").replace("8266", str(dashboard))
              .replace("--disable-usage-stats", f"--disable-usage-stats {agent_ports}")
              .replace('"HF_HUB_OFFLINE": "1"', f'"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": {json.dumps(os.environ["HF_HUB_CACHE"])}')
              .replace("/tmp/js/out", str(out)))
    script = script.replace("RAY_TEMP=$(mktemp -d /tmp/rayhead-XXXXXX)", 'RAY_TEMP=$(mktemp -d /tmp/rayhead-XXXXXX); echo "head temp dir $RAY_TEMP"', 1)
    script = script.replace('"$VENV/bin/ray" job submit', 'for try in 1 2 3 4 5 6 7 8 9 10; do "$VENV/bin/ray" job submit', 1)
    submit_end = script.index(f"--out {out}") + len(f"--out {out}")
    # right after `ray start` the head may answer 'No available agent to submit job, please try again later'
    script = (script[:submit_end] + ' > "$RAY_TEMP/submit.log" 2>&1; rc=$?; grep -q "No available agent" "$RAY_TEMP/submit.log" '
              '|| break; sleep 2; done; cat "$RAY_TEMP/submit.log"; echo "submit exit $rc"' + script[submit_end:])
    outside = {key: value for key, value in os.environ.items()
               if not key.startswith(("VIRTUAL_ENV", "PYTHON", "RAY_", "COLUMNS", "LINES"))}
    outside.update(PATH="/usr/local/bin:/usr/bin:/bin", RAYGEOM=str(ROOT), HOME=str(tmp_path))
    # this session's own Ray (started by this process, so its GCS server and raylet are our children)
    import psutil

    others = [child.pid for child in psutil.Process().children(recursive=True) if long_lived(child.pid)]
    assert others
    temp = None
    try:
        done = subprocess.run(["bash", "-c", script], env=outside, capture_output=True, text=True, timeout=540, check=False)
        printed = done.stdout + done.stderr
        temp = re.search(r"head temp dir (/tmp/rayhead-\w+)", printed)
        assert "submit exit 0" in printed, printed[-4000:]
        assert "succeeded" in printed, printed[-4000:]
        rows = [line for line in printed.splitlines() if line.startswith("│")]
        assert [row.split("│")[1].strip() for row in rows] == ["block_01.mlp_out", "block_01"], printed[-3000:]
        assert (out / "results" / "pga.parquet").is_file()
        # the recipe's last line stopped its head ...
        assert temp, printed[-2000:]
        deadline = time.time() + 30
        while processes_naming(temp.group(1)) and time.time() < deadline:
            time.sleep(0.5)
        survivors = processes_naming(temp.group(1))
        assert not survivors, [Path(f"/proc/{pid}/cmdline").read_bytes()[:300] for pid in survivors]
        # ... and nothing else: this session's own Ray is still up
        import ray

        assert ray.is_initialized() and ray.cluster_resources().get("CPU", 0) >= 1
        assert all(Path(f"/proc/{pid}").exists() for pid in others)
    finally:
        if temp:
            for pid in processes_naming(temp.group(1)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
