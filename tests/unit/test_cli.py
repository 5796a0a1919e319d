import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tpustream.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    "args",
    [
        [], ["shards"], ["shards", "create"], ["shards", "verify"], ["train"], ["evaluate"], ["promote"],
        ["champion", "show"], ["pipeline", "compile"], ["pipeline", "submit"], ["pipeline", "schedule"],
        ["pipeline", "run-local"], ["weights"], ["weights", "fetch"], ["bench"], ["bench", "write"], ["bench", "load"], ["bench", "train"],
        ["dev"], ["dev", "gcs-server"],
    ],
)  # fmt: skip
def test_every_command_has_help(args):
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_help_imports_no_torch():
    """Every option is read from a config dataclass in a torch-free module: help needs no trainer."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from tpustream.cli.main import app\n"
        "for args in (['train'], ['shards', 'create'], ['shards', 'check'], ['predict'], ['evaluate']):\n"
        "    assert CliRunner().invoke(app, [*args, '--help']).exit_code == 0, args\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_xla', 'torchvision')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_help_and_the_compile_options_import_no_kfp():
    """`pipeline compile`'s options are derived from Capacity and StepResources (kfp-free modules), so the
    CLI, its help and compile's help load no kfp (submit's help lists the pipeline's parameters: it does)."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from tpustream.cli.main import app\n"
        "for args in ([], ['pipeline'], ['pipeline', 'compile'], ['pipeline', 'run-local']):\n"
        "    assert CliRunner().invoke(app, [*args, '--help']).exit_code == 0, args\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kfp'))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_create_verify_and_refuse_again(tmp_path):
    out = str(tmp_path / "ds")
    result = runner.invoke(app, ["shards", "create", "--output", out, "--num-shards", "3", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "wrote 1797 samples" in result.output and "0 skipped" in result.output
    result = runner.invoke(app, ["shards", "verify", out])
    assert result.exit_code == 0 and "ok: 4 shards" in result.output
    result = runner.invoke(app, ["shards", "create", "--output", out])
    assert result.exit_code == 2 and "--overwrite" in result.output


def test_verify_exits_nonzero_naming_bad_shards(tmp_path):
    out = tmp_path / "ds"
    assert runner.invoke(app, ["shards", "create", "--output", str(out), "--num-shards", "2"]).exit_code == 0
    (out / "train" / "train-000001.tar").write_bytes(b"garbage")
    result = runner.invoke(app, ["shards", "verify", str(out)])
    assert result.exit_code == 1
    assert "BAD train/train-000001.tar" in result.output and "1 of 3 shards failed" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--source", "nope"], "unknown source 'nope'"),
        (["--num-shards", "0"], "--num-shards must be at least 1"),
        (["--source", "synthetic-cifar:5", "--num-shards", "9"], "cannot fill 9 shards"),
        (["--output", "pipe:cat"], "pipe:"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, args, message):
    full = ["shards", "create", "--output", str(tmp_path / "o"), *args]
    result = runner.invoke(app, full)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "command",
    [["report", "--model", "m", "--output", "o"], ["promote", "--candidate", "m", "--registry", "r"]],
)
def test_report_decides_with_promotes_max_p_value(tmp_path, command):
    """`report` takes promote's --max-p-value (one option, cli/options.py) into the same PromotionPolicy."""
    args = [*command, "--metrics", str(tmp_path / "metrics.json"), "--max-p-value", "0"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--max-p-value 0.0: a probability in (0, 1]" in result.output


def test_report_decides_on_max_p_value_as_promote_does(tmp_path):
    """The candidate beats champion version 2 (0.80 vs 0.7625), which evaluate did not score on the same
    samples: without --max-p-value the report's decision is promote, with it the champion is kept."""
    from dataclasses import replace

    from tests.common.report import sample_facts

    facts = sample_facts()
    for folder in ("model", "data", "registry"):
        (tmp_path / folder).mkdir()
    (tmp_path / "model/model.json").write_text(json.dumps(facts.model_card.to_json()))
    metrics = replace(facts.metrics, dataset=replace(facts.metrics.dataset, uri=str(tmp_path / "data")))
    (tmp_path / "metrics.json").write_text(json.dumps(metrics.to_json()))
    (tmp_path / "data/manifest.json").write_text(json.dumps(facts.manifest.to_json()))
    (tmp_path / "registry/champion.json").write_text(json.dumps({"version": 2, "model_sha256": "c0ffee"}))
    args = ["report", "--model", str(tmp_path / "model"), "--metrics", str(tmp_path / "metrics.json")]
    args += ["--registry", str(tmp_path / "registry"), "--output", str(tmp_path / "out")]
    promoted = runner.invoke(app, args)
    assert promoted.exit_code == 0, promoted.output
    assert promoted.output.startswith("decision: promote (candidate top1 0.8000 beats champion 0.7625")
    kept = runner.invoke(app, [*args, "--max-p-value", "0.05"])
    assert kept.exit_code == 0, kept.output
    assert kept.output.startswith("decision: keep the champion (")
    assert "--max-p-value 0.05 needs both scored on the same samples" in kept.output


def test_verify_of_missing_dataset(tmp_path):
    result = runner.invoke(app, ["shards", "verify", str(tmp_path)])
    assert result.exit_code == 2 and "no dataset" in result.output


def test_bench_write_prints_json_lines():
    result = runner.invoke(
        app,
        [
            "bench",
            "write",
            "--samples",
            "400",
            "--imagenet-samples",
            "20",
            "--repeats",
            "1",
            "--samples-per-shard",
            "100",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines()]
    writers = [(r["data"], r.get("writer")) for r in lines if r["bench"] == "write"]
    assert writers == [
        ("cifar-size-ppm", "stock-webdataset"), ("cifar-size-ppm", "tpustream"),
        ("imagenet-size-jpeg", "stock-webdataset"), ("imagenet-size-jpeg", "tpustream"),
    ]  # fmt: skip
    # shard creation with the perceptual hash off and on, in the same run, at CIFAR and ImageNet sizes
    costs = [r for r in lines if r["bench"] == "write-phash"]
    assert [r["data"] for r in costs] == [
        "cifar-size-ppm",
        "imagenet-size-jpeg-500x375",
        "imagenet-size-jpeg-224x224",
    ]
    assert all(r["us_per_sample_with_hash"] > 0 and r["goal"] == 0.10 for r in costs)
    ours = next(r for r in lines if r.get("writer") == "tpustream")
    stock = next(r for r in lines if r.get("writer") == "stock-webdataset")
    assert ours["header_bytes_per_sample"] == 1024  # two 512-byte USTAR headers, no PAX
    assert stock["tar_overhead_bytes_per_sample"] > ours["tar_overhead_bytes_per_sample"] + 1500
    assert {r["format"] for r in lines if r["bench"] == "encoding"} == {"ppm", "png"}
    # the thumbnails' window hashes: hash off, pHash alone, pHash and windows, in the same run
    windows = [r for r in lines if r["bench"] == "write-phash-windows"]
    assert [r["data"] for r in windows] == ["cifar-size-ppm", "thumbnail-png-32x32"]
    assert all(
        r["us_per_sample_phash_and_windows"] > 0 and "slowdown_cpu_windows_alone" in r for r in windows
    )


def test_pipeline_commands_check_their_input_before_any_cloud_call(tmp_path, monkeypatch):
    template = str(tmp_path / "p.yaml")
    common = ["--project", "p", "--pipeline-root", "gs://b/runs", "--registry", "gs://b/registry"]
    common += ["--param", "source=gs://b/images"]
    result = runner.invoke(app, ["pipeline", "submit", "--template", template, *common])
    assert result.exit_code == 2 and "no such file" in result.output and "pipeline compile" in result.output
    result = runner.invoke(app, ["pipeline", "compile", "--output", template])
    assert result.exit_code == 2 and "--image" in result.output and not os.path.exists(template)
    images = [
        "--image",
        "europe-docker.pkg.dev/p/r/cpu@sha256:" + "c" * 64,
        "--tpu-image",
        "europe-docker.pkg.dev/p/r/tpu:7",
    ]
    result = runner.invoke(app, ["pipeline", "compile", "--output", template, *images])
    assert result.exit_code == 0 and "v3-8" in result.output
    from tpustream.pipelines.tpu import TPU_TYPES

    help_text = "".join(runner.invoke(app, ["pipeline", "compile", "--help"]).output.replace("│", "").split())
    assert all(f"{name}:" in help_text for name in TPU_TYPES)  # listed from the one table
    assert "v5e-16:ct5lp-hightpu-4ttopology4x4,4hosts" in help_text
    result = runner.invoke(
        app, ["pipeline", "schedule", "--template", template, "--cron", "every monday", *common]
    )
    assert result.exit_code == 2 and "five fields" in result.output
    # Issue 37: no --param source would train on the pipeline's default, the bundled digits: refused, saying how
    for command in (["submit"], ["schedule", "--cron", "0 3 * * 1"]):
        result = runner.invoke(app, ["pipeline", *command, "--template", template, *common[:-2]])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: --param source is required for a Vertex AI run: "), (
            result.output
        )
        assert "the bundled digits" in result.stderr and "--param source=gs://BUCKET/images" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    # Issue 26: the TensorBoard instance and the experiment, checked before any credential is needed
    tensorboard = "projects/p/locations/europe-west4/tensorboards/42"
    for args, message in [
        (["--tensorboard", "my-board"], "--tensorboard 'my-board' is not a Vertex AI TensorBoard instance"),
        (["--tensorboard", tensorboard], "in europe-west4 and the run in --region us-central1"),
        (
            ["--experiment", "My_Experiment"],
            "--experiment 'My_Experiment' is not a Vertex AI Experiment name",
        ),
    ]:
        result = runner.invoke(app, ["pipeline", "submit", "--template", template, *common, *args])
        assert result.exit_code == 2 and message in result.output, result.output
    result = runner.invoke(
        app, ["pipeline", "compile", "--output", template, *images, "--tensorboard", "tb/1"]
    )
    assert result.exit_code == 2 and "--tensorboard 'tb/1'" in result.output
    result = runner.invoke(
        app, ["pipeline", "compile", "--output", template, *images, "--tpu", "", "--tensorboard", tensorboard]
    )
    assert (
        result.exit_code == 2 and "--tensorboard: the CPU image" in result.output and "--tpu" in result.output
    )
    # Credentials that cannot be found: a clear message instead of google-auth's traceback.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    monkeypatch.delenv("TPUSTREAM_VERTEX_ENDPOINT", raising=False)
    result = runner.invoke(app, ["pipeline", "submit", "--template", template, *common])
    assert result.exit_code == 2 and "credentials" in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    # what helps is said; --skip-preflight, which cannot (Vertex needs the same credentials), is not suggested
    assert (
        "gcloud auth application-default login" in result.stderr
        and "GOOGLE_APPLICATION_CREDENTIALS" in result.stderr
    )
    assert "--skip-preflight would not help" in result.stderr and "pass --skip-preflight" not in result.stderr
    skipped = runner.invoke(app, ["pipeline", "submit", "--template", template, *common, "--skip-preflight"])
    assert skipped.exit_code == 2 and "gcloud auth application-default login" in skipped.stderr
    assert "--skip-preflight" not in skipped.stderr and "Traceback" not in skipped.output


def test_pipeline_yaml_options_take_file_uris(tmp_path, monkeypatch):
    # issue 15: `pipeline compile --output file:///x.yaml` was a FileNotFoundError traceback
    monkeypatch.chdir(tmp_path)
    images = [
        "--image",
        "europe-docker.pkg.dev/p/r/cpu@sha256:" + "c" * 64,
        "--tpu-image",
        "europe-docker.pkg.dev/p/r/tpu:7",
    ]
    result = runner.invoke(app, ["pipeline", "compile", "--output", f"file://{tmp_path}/p.yaml", *images])
    assert result.exit_code == 0 and (tmp_path / "p.yaml").is_file(), result.output
    result = runner.invoke(app, ["pipeline", "compile", "--output", "gs://b/p.yaml", *images])
    assert (
        result.exit_code == 2
        and "give a local file path" in result.output
        and "Traceback" not in result.output
    )
    assert os.listdir(tmp_path) == ["p.yaml"]
    common = ["--project", "p", "--pipeline-root", "gs://b/runs", "--registry", "gs://b/registry"]
    result = runner.invoke(app, ["pipeline", "submit", "--template", f"file://{tmp_path}/nope.yaml", *common])
    assert result.exit_code == 2 and f"--template {tmp_path}/nope.yaml: no such file" in result.output


def test_run_local_rejects_a_bad_source_up_front(tmp_path):
    result = runner.invoke(
        app, ["pipeline", "run-local", "--root", str(tmp_path), "--source", str(tmp_path / "none")]
    )
    assert result.exit_code == 2 and "unknown source" in result.output
    assert not (tmp_path / "pipeline-root").exists()  # nothing ran


def test_bench_counts_must_be_positive():
    result = runner.invoke(app, ["bench", "write", "--repeats", "0"])
    assert result.exit_code == 2 and "--repeats" in result.output


def test_logging_follows_the_current_stderr(monkeypatch):
    """The CLI's log handler writes to the stderr of the moment: a caller that swaps and closes stderr
    between invocations (CliRunner does) gets no "--- Logging error ---" in the next one's output."""
    import io
    import logging

    from tpustream.cli.app import _setup_logging

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    first = io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    _setup_logging()
    first.close()
    second = io.StringIO()
    monkeypatch.setattr("sys.stderr", second)
    _setup_logging()
    logging.getLogger("tpustream.test").warning("after the first stream closed")
    assert "after the first stream closed" in second.getvalue() and "Logging error" not in second.getvalue()


def test_an_evaluate_error_is_one_line_not_a_traceback(tmp_path):
    """A manifest.json that is not a manifest ends `evaluate` in a ShardError: one line, exit 2."""
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "manifest.json").write_text("{}")
    args = [
        "evaluate",
        "--model",
        str(tmp_path / "m"),
        "--data",
        str(tmp_path / "ds"),
        "--output",
        str(tmp_path / "o"),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "is not a tpustream manifest" in result.output and "Traceback" not in result.output


def test_a_config_error_is_one_line_and_a_bare_value_error_is_a_bug_with_its_traceback():
    """The CLI's one error boundary: ConfigError (an option out of range) is the user's to fix; a bare
    ValueError from a library or our own code is a bug, and its traceback is not swallowed."""
    from tpustream.cli.app import _user_error_message
    from tpustream.errors import ConfigError
    from tpustream.train.config import TrainConfig

    with pytest.raises(ConfigError) as raised:
        TrainConfig(data="d", output="o", epochs=0)
    assert isinstance(raised.value, ValueError)  # callers that caught ValueError still do
    assert _user_error_message(raised.value) == str(raised.value)
    assert _user_error_message(ValueError("invalid literal for int() with base 10: 'x'")) is None
    result = CliRunner().invoke(app, ["train", "--data", "d", "--output", "o", "--epochs", "0"])
    assert result.exit_code == 2 and "epochs" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "option, value, choices",
    [("--strategy", "mesh", ("spmd", "replicas")), ("--class-weights", "balanced", ("none", "auto"))],
)
def test_a_train_choice_outside_its_literal_names_the_option_the_value_and_the_choices(
    option, value, choices
):
    """TrainConfig's choice fields are ``Literal``: the CLI refuses another value before anything runs, in
    one message naming the option, the value and every choice; a config built in code (the pipeline's
    component) still gets the config's own one-line ConfigError."""
    from tpustream.errors import ConfigError
    from tpustream.train.config import TrainConfig

    result = runner.invoke(app, ["train", "--data", "d", "--output", "o", option, value])
    assert result.exit_code == 2 and "Traceback" not in result.output
    text = " ".join(result.output.replace("\u2502", " ").split())  # the error box, unwrapped
    assert f"Invalid value for '{option}'" in text and f"{value!r} is not one of" in text
    assert all(repr(choice) in text for choice in choices)
    field = option.removeprefix("--").replace("-", "_")
    with pytest.raises(ConfigError, match=f"{option} must be {' or '.join(choices)}, got {value!r}"):
        TrainConfig(data="d", output="o", **{field: value})


def test_champion_show_and_history_take_the_registry_as_argument_or_option(tmp_path):
    """`champion show` took --registry and `champion history` an argument: each takes both now, and the
    old invocations still work; the registry given twice (differently) or not at all is one line."""
    registry = str(tmp_path / "registry")
    os.makedirs(registry)
    for command, expected in (("show", '"message": "no champion yet"'), ("history", "no decisions yet in")):
        as_argument = runner.invoke(app, ["champion", command, registry])
        as_option = runner.invoke(app, ["champion", command, "--registry", registry])
        both_same = runner.invoke(app, ["champion", command, registry, "--registry", registry])
        assert as_argument.exit_code == as_option.exit_code == both_same.exit_code == 0, as_argument.output
        assert expected in as_argument.stdout and as_argument.stdout == as_option.stdout == both_same.stdout
        twice = runner.invoke(app, ["champion", command, registry, "--registry", str(tmp_path / "other")])
        assert twice.exit_code == 2 and twice.stderr.strip() == (
            f"error: champion {command}: the registry is given twice, {registry} and --registry "
            f"{tmp_path / 'other'}: give one"
        )
        missing = runner.invoke(app, ["champion", command])
        assert missing.exit_code == 2 and missing.stderr.startswith(
            f"error: champion {command}: give the registry"
        )
        assert "Traceback" not in missing.output
