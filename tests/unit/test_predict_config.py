"""tpustream/serve/predict/config.py: ``PredictConfig`` is where `tpustream predict`'s options and their one set
of defaults are written; the command reads them from it (cli/options.py's from_config)."""

import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from tpustream.cli.main import app
from tpustream.serve.predict.config import DEFAULT_WORKERS, PredictConfig, PredictError
from tpustream.serve.settings import Limits


def _predict_options():
    command = typer.main.get_command(app).commands["predict"]  # type: ignore[attr-defined]
    return {param.name: param for param in command.params}


def test_the_command_s_defaults_are_the_config_s():
    options = _predict_options()
    for field in dataclasses.fields(PredictConfig):
        if field.name == "model":  # required, but optional on the command line: --vertex-batch needs none
            assert options["model"].default == ""
        elif field.name == "inputs":  # the command's argument
            assert options["inputs"].default is None and options["inputs"].nargs == -1
        else:
            assert options[field.name].default == field.default, field.name
    # the three the command once set by hand: the serving container's, and one decode process per CPU but one
    defaults = PredictConfig(model="m", inputs=("x",))
    assert (defaults.batch_size, defaults.max_pixels) == (Limits().batch_size, Limits().max_pixels)
    assert defaults.workers == DEFAULT_WORKERS and 0 <= DEFAULT_WORKERS <= 8


def test_help_documents_every_option():
    output = CliRunner().invoke(app, ["predict", "--help"], env={"COLUMNS": "200"}).output
    text = "".join(output.replace("│", "").split())  # without rich's box and line breaks
    for field in dataclasses.fields(PredictConfig):
        name = "--json" if field.name == "as_json" else f"--{field.name.replace('_', '-')}"
        assert field.name == "inputs" or name in text, name
    assert "IMAGE_OR_URI" in text and "--vertex-batch" in text
    assert "Default:oneperCPUbutone,atmost8." in text  # the field's docstring is the help


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"inputs": ()}, "nothing to predict"),
        ({"output": "o", "as_json": True}, "give one of them"),
        ({"top_k": 0}, "--top-k must be at least 1"),
        ({"batch_size": 0}, "--batch-size must be at least 1"),
        ({"max_pixels": 0}, "--max-pixels must be at least 1"),
        ({"part_size": 0}, "--part-size must be at least 1"),
        ({"limit": 0}, "--limit must be at least 1"),
        ({"workers": -1}, "--workers must be 0 or more"),
        ({"sample_val": -1}, "--sample-val must be 0 or more"),
    ],
)
def test_a_bad_option_is_one_clear_error(changes, message):
    with pytest.raises(PredictError, match=message):
        PredictConfig(**{"model": "m", "inputs": ("x",), **changes})


def test_the_arguments_list_becomes_the_inputs_tuple_and_the_limits_follow_the_options():
    config = PredictConfig(model="m", inputs=["a", "b"], top_k=2, batch_size=4, max_pixels=100)  # type: ignore[arg-type]
    assert config.inputs == ("a", "b")
    assert config.limits() == Limits(batch_size=4, top_k=2, max_pixels=100)
    assert config.request("/m")["max_pixels"] == 100
