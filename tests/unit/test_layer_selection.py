"""--layers: integers count blocks, embed and final_norm are chosen by name (the rule in raygeom.params.LAYERS_HELP)."""

import pytest

from raygeom.errors import RaygeomError
from raygeom.params import LAYERS_HELP
from raygeom.sources.layers import layer_names, select_layers

LAYERS = layer_names(30)  # embed, block_00 .. block_29, final_norm (SmolLM2-135M)


def test_an_integer_is_the_block_of_that_number():
    assert select_layers(LAYERS, "5") == ["block_05"]
    assert select_layers(LAYERS, "0") == ["block_00"]
    assert select_layers(LAYERS, "29") == ["block_29"]


def test_negative_integers_count_back_from_the_last_block_not_the_final_norm():
    assert select_layers(LAYERS, "-1") == ["block_29"]
    assert select_layers(LAYERS, "-30") == ["block_00"]


def test_ranges_are_block_numbers_with_the_end_excluded():
    assert select_layers(LAYERS, "2:5") == ["block_02", "block_03", "block_04"]
    assert select_layers(LAYERS, "27:") == ["block_27", "block_28", "block_29"]
    assert select_layers(LAYERS, ":") == LAYERS[1:-1]


def test_names_select_embed_final_norm_and_blocks_padded_or_not():
    assert select_layers(LAYERS, "final_norm,embed") == ["embed", "final_norm"]
    assert select_layers(LAYERS, "block_5,block_05,5") == ["block_05"]
    assert select_layers(LAYERS, "all") == LAYERS


def test_results_come_in_depth_order_without_repeats():
    assert select_layers(LAYERS, "final_norm,-1,3,embed,2:4") == ["embed", "block_02", "block_03", "block_29", "final_norm"]


def test_three_digit_block_names_of_deep_models():
    deep = layer_names(120)
    assert select_layers(deep, "5,block_7,-1") == ["block_005", "block_007", "block_119"]


@pytest.mark.parametrize("bad", ["30", "-31", "block_30", "40:50", "norm", "1.5"])
def test_a_layer_that_does_not_exist_is_one_clear_error(bad):
    with pytest.raises(RaygeomError, match="integers count blocks") as error:
        select_layers(LAYERS, bad)
    assert "30 blocks" in str(error.value) and "embed, final_norm" in str(error.value)


def test_the_help_text_states_the_rule():
    assert "5 = block_05" in LAYERS_HELP and "embed" in LAYERS_HELP and "final_norm" in LAYERS_HELP


@pytest.mark.parametrize("command", ["run", "pga", "diagnose", "converge", "probe", "dispersion", "knn"])
def test_every_layers_option_states_the_rule_in_its_help(command):
    from typer.testing import CliRunner

    from raygeom.cli.root import app

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400", "TERM": "dumb"})
    assert result.exit_code == 0
    text = " ".join(result.output.replace("│", " ").split())
    assert "--layers" in text and "Integers count blocks: 5 = block_05" in text and "final_norm are named" in text


def test_a_job_file_range_may_name_a_point_inside_its_blocks():
    from raygeom.jobspec import check_layer_selection

    check_layer_selection("0:2.mlp_out,-1.attn_out")
    assert select_layers(LAYERS, "0:2.mlp_out") == ["block_00.mlp_out", "block_01.mlp_out"]
    with pytest.raises(RaygeomError, match="selects no layer"):
        check_layer_selection("4:2.resid_mid")
