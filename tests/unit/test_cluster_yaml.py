"""cluster.yaml is checked offline against the Ray autoscaler's own schema and our sweep's needs."""

import copy
from pathlib import Path

import pytest
import yaml

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "cluster.yaml"


def _validate(config: dict) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_cluster_yaml_passes_the_autoscaler_schema(config):
    prepared = _validate(config)
    assert prepared["provider"]["type"] == "aws"


def test_cpu_head_and_gpu_workers_with_explicit_resources(config):
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert workers and all(t["resources"]["GPU"] >= 1 and t["resources"]["CPU"] >= 1 for t in workers)
    assert {t["node_config"]["InstanceType"].split(".")[0] for t in workers} >= {"g5", "p4de"}


def test_setup_installs_raygeom_and_keeps_the_hf_cache_on_local_disk(config):
    setup = " ".join(config["setup_commands"])
    assert "pip install" in setup and "~/raygeom" in setup and "~/raygeom" in config["file_mounts"]
    assert "HF_HOME=/opt/dlami/nvme" in setup


@pytest.mark.parametrize("breakage", ["unknown_top_level_key", "head_type_missing", "resources_not_a_dict"])
def test_the_schema_check_rejects_broken_configs(config, breakage):
    broken = copy.deepcopy(config)
    if breakage == "unknown_top_level_key":
        broken["worker_nodes_typo"] = {}
    elif breakage == "head_type_missing":
        broken["head_node_type"] = "no_such_type"
    else:
        broken["available_node_types"]["gpu_a10g_x4"]["resources"] = "4 GPUs"
    with pytest.raises(Exception):  # noqa: B017 - ray's validator raises several types (jsonschema, ValueError, KeyError)
        _validate(broken)
