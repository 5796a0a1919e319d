"""The scenario suite: the pipeline through kfp.local in the combinations a user runs, not one feature at a
time (issue 42, item 7). Each axis is a feature; a new feature adds its axis to ``AXES`` (the way torchtitan's
``tests/integration_tests/features.py`` lists flag combinations that one launcher runs).

A chain is one registry's life: a first run, then a warm-started challenger (``init_from=champion``, the
pipeline's default) on the same data (``retrain=true``). After each run the champion answers through
``tpustream predict`` and through the real model server, and what the history, the run report and the webhook
say is checked. The cheapest chain goes on with a refused challenger (a quality floor), a nothing-new run and
a retrain on leaky data (stopped at the data check, the champion untouched).

Axes:
- weights: ``random`` (random init) or ``staged-pth`` (a torchvision-layout resnet18 ``.pth`` on gs://, the
  GCS-API server on loopback: the pretrained weights a user stages; random values stand in for ImageNet's).
- input size: 32 px (small: a random-init resnet gets the small-input stem, a fine-tuned one keeps its stock
  stem) or 96 px (full size: the stock stem either way).
- data: ``clean`` or ``leaky`` (issue 45: the test split holds a JPEG re-save and a resized copy of train
  photos, at a size where the perceptual hash applies): the run stops at the data check (``near-leak``).
- recipe: ``auto`` (by model and data size) or ``modern`` (issue 46: a named recipe given, with RandAugment,
  random erasing, MixUp/CutMix alphas and an EMA given too).
- search: ``off`` (one train step) or ``tune`` (issue 46: the pipeline's tune switch, two optuna trials;
  the best trial's model is the candidate, no retraining).
- devices: 4 virtual XLA devices (SPMD, run-local's default: a 4-chip TPU host) or 1. The same global batch
  (32) either way. On this 2-core machine 4 virtual devices train about 3x slower than one: ``tpustream
  train`` of resnet18 at 32 px, synthetic-cifar:640, one epoch of 19 steps, 7 compiles each, run alternately
  twice beside a benchmark: 202 s and 204 s on 4 devices, 67 s and 74 s on one.

Why these combinations (``SCENARIOS``), not the 32 of the cross product: every pair of values of two axes runs
in some chain (pairwise coverage), at the least added time. The five axes' pairs among the four training axes
(weights, input size, recipe, search) take five chains: the four weights x input size chains, three of them
given a new value (a tuned random 96 px, a tuned staged 32 px, a modern staged 96 px), and one new chain, a
tuned modern random 32 px (random weights: the cheapest runs). The two tuned random-weight chains run on 4
devices (a search, and the compiled step's MixUp/CutMix, EMA and padded last batch, sharded), the other three
on one: every value of every other axis meets one device; 4 devices meet random weights, both input sizes,
both recipes and the search. The two pairs left, staged weights on 4 devices and an untuned run on 4 devices,
are ``tests/integration/test_pretrained_train.py``'s and ``tests/integration/test_pipeline.py``'s. Leaky data
trains nothing, so its pairs cost a data check each: a leaky first run that would have been staged, 96 px,
modern and tuned (it must stop before the search spends a trial), and the cheapest chain's leaky retrain
(random, 32 px, auto, off) as a warm-started challenger. A tuned chain's challenger is tuned too, as a pipeline compiled with the switch runs
every time; its search space (two trials) searches the LR around the run's default and the MixUp alpha.

resnet18 on XLA CPU: every run compiles its network, so the suite takes minutes: it has its own marker,
``scenario`` (``make test-scenarios``; CI runs it after ``make test`` and ``make test-slow``).
"""

from __future__ import annotations

import base64
import io
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from typer.testing import CliRunner

from tests.common.serving import free_port, start_server
from tests.common.sources import digit_images
from tests.fakes.gcs import make_bucket
from tests.fakes.webhook_receiver import WebhookReceiver
from tpustream.cli import app
from tpustream.registry.history import champion_history
from tpustream.registry.store import champion_status, version_uri
from tpustream.serve.contract import HEALTH_ROUTE, PREDICT_ROUTE, SERVING_ENV

pytestmark = [pytest.mark.integration, pytest.mark.scenario]

Weights = Literal["random", "staged-pth"]
Data = Literal["clean", "leaky"]
RecipeAxis = Literal["auto", "modern"]
Search = Literal["off", "tune"]
AXES: dict[str, tuple[object, ...]] = {
    "weights": ("random", "staged-pth"),
    "input_size": (32, 96),
    # clean: the digits; leaky: the same digits in train/val/test folders, with scikit-image photos in train and
    # in test a JPEG re-save and a 90% resize of two of them (near-leak: the run stops at the data check)
    "data": ("clean", "leaky"),
    # auto: the recipe chosen by model and data size; modern: a named recipe given (scratch from random
    # weights, finetune from staged ones) with RandAugment, random erasing, MixUp/CutMix alphas and an EMA
    "recipe": ("auto", "modern"),
    # off: one train step; tune: the pipeline's tune switch (run_local(tune=True)), two optuna trials
    "search": ("off", "tune"),
    # 4: run-local's default, SPMD over 4 virtual XLA devices; 1: one device, the same global batch
    "devices": (4, 1),
}
GLOBAL_BATCH = 32
CLASSES = 4  # digits 0-3 (the staged weights were trained on 4-9)
PRETRAIN_STEPS = 60  # the staged weights' training: plain torch on the CPU, seconds
# The modern recipe's values given beside its name: each a TrainConfig field and pipeline parameter
MODERN = {"augment": "randaugment", "random_erasing": 0.25, "mixup_alpha": 0.4, "cutmix_alpha": 1.0}
MODERN_EMA = 0.99  # a short run's EMA: a horizon of about 100 steps
TRIALS = 2


@dataclass(frozen=True)
class Budget:
    """What a chain's runs train on and for how long. A fine-tuned first run must beat the majority-class
    baseline, as the pipeline's default requires (about 720 images of digits 0-3, three epochs). A random-init
    resnet18 needs minutes of CPU to beat it, so those chains turn the check off (``beat_majority_baseline``:
    its refusal is tested in tests/integration/test_pipeline.py) and train one epoch on fewer images: what they
    are here for is the network every door builds, not accuracy."""

    images: int  # the first N of scikit-learn's 1,797 digits, of which about 40% are 0-3
    epochs: int
    beat_majority_baseline: bool


BUDGETS = {"random": Budget(400, 1, False), "staged-pth": Budget(1797, 3, True)}
CHALLENGER_EPOCHS = 1  # a warm-started run starts from the champion


@dataclass(frozen=True)
class Scenario:
    weights: Weights
    input_size: int
    data: Data = "clean"
    recipe: RecipeAxis = "auto"
    search: Search = "off"
    devices: int = 4

    @property
    def id(self) -> str:
        """``random-32px``; a value off its axis's default is added: ``staged-pth-96px-modern-1dev``."""
        added = [value for value, default in ((self.data, "clean"), (self.recipe, "auto"), (self.search, "off"))
                 if value != default]  # fmt: skip
        devices = [f"{self.devices}dev"] if self.devices != 4 else []
        return "-".join([f"{self.weights}-{self.input_size}px", *added, *devices])

    @property
    def small_input_stem(self) -> bool:
        """The stem every reader must build: the small-input one for random weights under 96 px only."""
        return self.weights == "random" and self.input_size < 96


# Pairwise coverage of AXES (the module's docstring says why these): each pair of two axes' values is in a row.
CHEAPEST = Scenario("random", 32, devices=1)
SCENARIOS = [
    CHEAPEST,  # goes on: a refused challenger, a nothing-new run, a leaky retrain
    Scenario("random", 96, search="tune"),
    Scenario("staged-pth", 32, search="tune", devices=1),
    Scenario("staged-pth", 96, recipe="modern", devices=1),
    Scenario("random", 32, recipe="modern", search="tune"),
]
LEAKY = [Scenario("staged-pth", 96, data="leaky", recipe="modern", search="tune")]  # stops before training


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """An image folder of digits 0-3 per weights axis (its Budget's images)."""
    made = {}
    for weights, budget in BUDGETS.items():
        root = tmp_path_factory.mktemp(f"scenario-{weights}") / "digits"
        digit_images(root, 0, budget.images, classes=range(CLASSES))
        made[weights] = str(root)
    made["leaky"] = str(
        _leaky_folder(tmp_path_factory.mktemp("scenario-leaky") / "digits", Path(made["random"]))
    )
    return made


PLANTED = {"coffee": "coffee-resaved.jpg", "rocket": "rocket-small.png"}  # train photo -> its copy in test


def _leaky_folder(root: Path, digits: Path) -> Path:
    """The cheapest chain's digits split into train/, val/ and test/ folders (a fifth each to val and test:
    their classes' shares as the champion's data), with two scikit-image photos per class in train (at 240 px,
    where the perceptual hash applies: the 8 px digits are checked exact-only) and, in test, a q70 JPEG
    re-save of one and a 90% resize of another (``PLANTED``): no byte copy anywhere."""
    import shutil

    from PIL import Image

    from tests.common.photos import TRAIN, jpeg_bytes, photo

    for n, image in enumerate(sorted(digits.glob("*/*.png"))):
        split = "test" if n % 5 == 0 else "val" if n % 5 == 1 else "train"
        folder = root / split / image.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(image, folder / image.name)
    for n, name in enumerate(TRAIN):  # 8 photos: two per class
        (root / "train" / str(n % CLASSES) / f"{name}.jpg").write_bytes(jpeg_bytes(photo(name)))
    coffee = Image.open(root / "train" / str(TRAIN.index("coffee") % CLASSES) / "coffee.jpg")
    (root / "test" / str(TRAIN.index("coffee") % CLASSES) / PLANTED["coffee"]).write_bytes(
        jpeg_bytes(coffee, quality=70)
    )
    rocket = Image.open(root / "train" / str(TRAIN.index("rocket") % CLASSES) / "rocket.jpg")
    rocket.resize((216, 162), Image.Resampling.BILINEAR).save(
        root / "test" / str(TRAIN.index("rocket") % CLASSES) / PLANTED["rocket"]
    )
    return root


@pytest.fixture(scope="module")
def staged_weights(gcs_server) -> Iterator[str]:
    """A torchvision-layout resnet18 state dict in a bucket, as a user stages ImageNet weights. No weights can
    be fetched here, so they are made: resnet18 (stock stem) trained briefly at 32 px on the digits the suite
    never classifies (4-9), so that its features transfer to digits 0-3 as ImageNet's do to a user's photos."""
    from sklearn.datasets import load_digits
    from torchvision import models as tv

    from tpustream.storage import io as storage

    make_bucket(gcs_server.url, "scenario-weights")
    digits = load_digits()
    source = torch.tensor(digits.images[digits.target >= CLASSES], dtype=torch.float32) / 16
    labels = torch.tensor(digits.target[digits.target >= CLASSES] - CLASSES)
    images = torch.nn.functional.interpolate(source[:, None], size=32, mode="bilinear").expand(-1, 3, -1, -1)
    torch.manual_seed(0)
    model = tv.resnet18(weights=None, num_classes=10 - CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for step in range(PRETRAIN_STEPS):
        batch = torch.randint(0, len(images), (64,), generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.cross_entropy(model(images[batch] - 0.5), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    uri = "gs://scenario-weights/staged/resnet18.pth"
    with pytest.MonkeyPatch.context() as patch:  # this module's runs, and kfp.local's task processes, see it
        patch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
        storage.write_bytes(uri, buffer.getvalue())
        yield uri


def _settings(scenario: Scenario, source: str, weights_uri: str, tmp_path: Path) -> dict[str, Any]:
    budget = BUDGETS[scenario.weights]
    recipe: dict[str, object] = {}
    if scenario.recipe == "modern":
        name = "finetune" if scenario.weights == "staged-pth" else "scratch"
        recipe = {"recipe": name, **MODERN, "ema_decay": MODERN_EMA}
    search: dict[str, object] = {}
    if scenario.search == "tune":
        search = {"tune": True, "tune_space": _space(scenario, tmp_path)}
    return dict(
        **recipe,
        **search,
        source=source,
        model_name="resnet18",
        input_size=scenario.input_size,
        pretrained=weights_uri if scenario.weights == "staged-pth" else "",
        epochs=budget.epochs,
        beat_majority_baseline=budget.beat_majority_baseline,
        batch_size=GLOBAL_BATCH // scenario.devices,  # per device
        num_shards=4,
        shards_per_task=4,
        test_fraction=0.2,  # the held-out split decides, as a user's import file with a test split
        bf16=False,
        workers=1,
    )


def _space(scenario: Scenario, tmp_path: Path) -> str:
    """A search space of TRIALS trials (none stopped early): the LR from half to one and a half times the run's
    default, and the MixUp alpha (a recipe field: a trial's value overrides the recipe's)."""
    low, high = _lr_range(scenario)
    path = tmp_path / "space.yaml"
    path.write_text(
        f"max_trials: {TRIALS}\nmin_trials: {TRIALS}\nearly_stopping: false\nparameters:\n"
        f"  lr: {{min: {low}, max: {high}, scale: log}}\n  mixup_alpha: {{min: 0.0, max: 0.2}}\n"
    )
    return str(path)


def _lr_range(scenario: Scenario) -> tuple[float, float]:
    default = _default_peak_lr(scenario)
    return default / 2, default * 1.5


def _card(model_dir: str) -> dict:
    return json.loads(Path(model_dir, "model.json").read_text())


def _serve(model_dir: str, image: bytes, tmp_path: Path) -> dict:
    """The real aiplatform model server (the serving container's handler) on ``model_dir``: one answer."""
    port = free_port()
    env = {
        **os.environ,
        **SERVING_ENV,
        "AIP_HTTP_PORT": str(port),
        "AIP_HEALTH_ROUTE": HEALTH_ROUTE,
        "AIP_PREDICT_ROUTE": PREDICT_ROUTE,
        "AIP_STORAGE_URI": model_dir,
        "VERTEX_CPR_WEB_CONCURRENCY": "1",
    }
    env.pop("PJRT_DEVICE", None)
    server = start_server(env, port, tmp_path / f"server-{port}.log")
    try:
        body = json.dumps({"instances": [{"b64": base64.b64encode(image).decode()}]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{PREDICT_ROUTE}", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
            return json.loads(response.read())
    finally:
        server.terminate()
        server.wait(timeout=20)


def _champion_answers(registry: str, source: str, tmp_path: Path) -> None:
    """predict and the model server load the champion and agree on an image's class."""
    status = champion_status(registry)
    assert status.champion is not None
    model_dir = version_uri(registry, status.champion.version)
    image = sorted(Path(source, "0").glob("*.png"))[0]
    result = CliRunner().invoke(
        app, ["predict", "--model", registry, "--json", "--top-k", "1", "--workers", "0", str(image)]
    )
    assert result.exit_code == 0, result.output
    (predicted,) = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    tmp_path.mkdir(parents=True, exist_ok=True)
    served = _serve(model_dir, image.read_bytes(), tmp_path)
    (answer,) = served["predictions"]
    # the same network through both doors: the same class
    assert answer["classes"][0] == predicted["classes"][0], (predicted, answer)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_first_run_then_a_warm_started_challenger(scenario, sources, staged_weights, tmp_path, monkeypatch):
    from tpustream.pipelines.local import run_local

    monkeypatch.setenv("CPU_NUM_DEVICES", str(scenario.devices))  # run-local's tasks inherit it
    source = sources[scenario.weights]
    root = str(tmp_path / "run")
    settings = _settings(scenario, source, staged_weights, tmp_path)
    with WebhookReceiver() as hook:
        first = run_local(
            root=root, log_path=str(tmp_path / "first.log"), notify_webhook=hook.url, **settings
        )
    registry = first.registry
    assert first.data == "train" and first.outcome is not None
    assert first.outcome.decision == "promoted", first.outcome.line()
    champion = champion_status(registry).champion
    assert champion is not None and champion.version == 1
    card = _card(version_uri(registry, 1))
    assert card["small_input_stem"] is scenario.small_input_stem
    assert card["input_size"] == scenario.input_size
    assert (card["pretrained"] is not None) == (scenario.weights == "staged-pth")
    assert card["init"] is None  # no champion yet: random or the staged file
    # on the scenario's devices: its per-device batch times the devices the trainer found is the global batch
    assert (card["global_batch"], card["training"]["batch_size"]) == (
        GLOBAL_BATCH,
        GLOBAL_BATCH // scenario.devices,
    )
    page = Path(first.report).read_text()
    _recipe_and_search_recorded(scenario, card, page, first.pipeline_root)
    (told,) = hook.bodies
    assert told["state"] == "SUCCEEDED" and told["decision"] == "promoted"
    if BUDGETS[scenario.weights].beat_majority_baseline:  # it beat always answering the largest class
        assert told["candidate_value"] > told["baseline_value"], told
    assert told["baseline_value"] is not None  # measured and told either way
    assert '<section id="recipe">' in page and "Majority-class baseline" in page
    assert "accuracy on the class&#x27;s val samples" not in page  # the test split decided: its name is shown
    _champion_answers(registry, source, tmp_path / "first")

    # The warm-started challenger: the champion's weights (and so its stem), on the same data
    with WebhookReceiver() as hook:
        second = run_local(
            root=root,
            log_path=str(tmp_path / "second.log"),
            notify_webhook=hook.url,
            **{**settings, "retrain": True, "epochs": CHALLENGER_EPOCHS},
        )
    assert second.data == "train" and second.outcome is not None
    assert second.outcome.decision in ("promoted", "kept"), second.outcome.line()
    challenger = _challenger_card(second.pipeline_root)
    assert challenger["init"]["kind"] == "champion" and challenger["init"]["weights"] == "all"
    # the champion's network, whatever --pretrained says: the pipeline's evaluate and serving loaded it
    assert challenger["small_input_stem"] is scenario.small_input_stem
    assert challenger["pretrained"] is None  # the champion's weights started it, not the staged file
    assert second.report is not None
    _recipe_and_search_recorded(scenario, challenger, Path(second.report).read_text(), second.pipeline_root)
    (told,) = hook.bodies
    assert told["state"] == "SUCCEEDED" and told["decision"] == second.outcome.decision
    history = champion_history(registry)
    assert [entry["event"] for entry in history][0] == "promoted"
    assert len(history) == 2  # the first promotion and the challenger's decision, whichever it was
    _champion_answers(registry, source, tmp_path / "second")
    if scenario == CHEAPEST:  # the cheapest chain goes on
        _refused_then_nothing_new(root, settings, source, tmp_path)
        _stopped_at_the_data_check(root, {**settings, "source": sources["leaky"]}, tmp_path / "leaky", source)


@pytest.mark.parametrize("scenario", LEAKY, ids=[s.id for s in LEAKY])
def test_a_leaky_first_run_stops_at_the_data_check(scenario, sources, staged_weights, tmp_path):
    """A first run on leaky data: stopped before any training (or search), no champion, nothing in history."""
    settings = _settings(scenario, sources["leaky"], staged_weights, tmp_path)
    _stopped_at_the_data_check(str(tmp_path / "run"), settings, tmp_path)


def _stopped_at_the_data_check(
    root: str, settings: dict[str, Any], tmp_path: Path, champion_source: str = ""
) -> None:
    """A run on the leaky folder stops at the data check with the ``near-leak`` finding, every planted pair
    named in the check's report; the outcome, the webhook and the failure say so; nothing is trained, searched
    or evaluated; the registry's champion and history are as they were (a data refusal decides on no
    candidate: the history holds the promotion decisions), and the champion, if any, still answers."""
    from tpustream.pipelines.local import PipelineFailed, run_local

    from tpustream.registry.errors import RegistryError
    from tpustream.run.outcome import read_outcome

    registry = os.path.join(os.path.abspath(root), "registry")
    pipeline_root = Path(root, "pipeline-root")
    earlier = set(pipeline_root.iterdir()) if pipeline_root.is_dir() else set()
    before = champion_status(registry).champion
    try:
        history_before = champion_history(registry)
    except RegistryError:  # a first run: no registry yet
        history_before = None
    with WebhookReceiver() as hook, pytest.raises(PipelineFailed) as failed:
        run_local(root=root, log_path=str(tmp_path / "leaky.log"), notify_webhook=hook.url, **settings)
    assert "check-data failed" in str(failed.value) and "near-leak" in str(failed.value), failed.value
    new = set(pipeline_root.iterdir()) - earlier
    (outcome_file,) = [path / "run-outcome.json" for path in new if (path / "run-outcome.json").is_file()]
    outcome = read_outcome(str(outcome_file))
    assert outcome is not None and (outcome.step, outcome.decision) == ("check data", "refused"), outcome
    assert "near-leak" in outcome.reason and outcome.code is None and outcome.candidate_value is None
    # the check's Markdown report, which the outcome points at, names every planted pair
    (run_dir,) = [path for path in new if path.name.startswith("tpustream-training-")]
    report = run_dir / "check-data" / "report"
    assert outcome.report and Path(outcome.report.removeprefix("file://")) == report, outcome.report
    rows = [line for line in report.read_text().splitlines() if line.startswith("| test | ")]
    for original, copy in PLANTED.items():
        assert any(copy in row and f"{original}.jpg" in row and "/train/" in row for row in rows), rows
    (told,) = hook.bodies
    assert told["state"] == "FAILED" and told["decision"] == "refused" and told["step"] == "check data"
    assert told["reason"] == outcome.reason and told["failed_task"] == "check-data"
    assert told["text"].count("near-leak") == 1, told["text"]  # the refusal said once, not again as the error
    assert told["report"] == outcome.report and told["code"] is None
    # nothing trained, searched or evaluated after the check
    assert not [path for path, _, files in os.walk(run_dir) if "model.json" in files]
    assert not (run_dir / "evaluate-model").exists() and not list(run_dir.glob("*tun*"))
    after = champion_status(registry).champion
    assert after == before
    if history_before is None:
        assert after is None
    else:
        assert champion_history(registry) == history_before
        assert before is not None
        _champion_answers(registry, champion_source, tmp_path / "champion")  # a digit of its own data


def _recipe_and_search_recorded(scenario: Scenario, card: dict, page: str, pipeline_root: str) -> None:
    """The candidate's model card and its run report record the recipe that ran and, when tuned, the trial the
    candidate is (its parameters in the card's LR and recipe) and every trial."""
    recipe = card["recipe"]
    tuned = card.get("tuning")
    if scenario.recipe == "modern":
        assert recipe["name"] == ("finetune" if scenario.weights == "staged-pth" else "scratch"), recipe
        expected = {**MODERN, "ema_decay": MODERN_EMA}
        if tuned:
            expected["mixup_alpha"] = tuned["parameters"]["mixup_alpha"]  # the trial's, over the recipe's
        assert {key: recipe[key] for key in expected} == pytest.approx(expected), recipe
        assert set(expected) <= set(recipe["overridden"])
        assert recipe["model_weights"] in ("ema", "raw")
        assert "RandAugment" in page and "random erasing of a patch with probability 0.25" in page
        assert "CutMix alpha 1" in page and f"decay {MODERN_EMA:g} per step" in page
    else:
        auto = "small-data-finetune" if scenario.weights == "staged-pth" or card["init"] else "plain"
        assert recipe["name"] == auto, recipe  # a warm start is a start from trained weights
    if scenario.search == "off":
        assert tuned is None
        if card["init"] is None:  # the door's default: no --lr given
            assert card["peak_lr"] == pytest.approx(_default_peak_lr(scenario))
        return
    # tuned: the candidate is the best trial's model, as it trained; the report shows the trials
    assert tuned is not None and tuned["engine"] == "optuna" and tuned["trials"] == TRIALS, tuned
    low, high = _lr_range(scenario)
    assert card["peak_lr"] == pytest.approx(tuned["parameters"]["lr"]) and low <= card["peak_lr"] <= high
    assert recipe["mixup_alpha"] == pytest.approx(tuned["parameters"]["mixup_alpha"])
    run = sorted(Path(pipeline_root).glob("tpustream-training-*"))[-1]  # this run's (kfp.local: by time)
    assert json.loads((run / "tune-model" / "model" / "tuning.json").read_text())["best"] == tuned["trial"]
    assert '<section id="tuning">' in page and '<tr class="best">' in page


def _refused_then_nothing_new(root: str, settings: dict[str, Any], source: str, tmp_path: Path) -> None:
    """A challenger under a quality floor is refused, and that is history, in the run's report and in the
    webhook; then a run on unchanged data trains nothing, says so and records nothing."""
    from tpustream.pipelines.local import run_local

    with WebhookReceiver() as hook:
        refused = run_local(
            root=root,
            log_path=str(tmp_path / "refused.log"),
            notify_webhook=hook.url,
            **{**settings, "retrain": True, "epochs": 1, "min_metric": 0.999},
        )
    assert refused.outcome is not None and refused.outcome.decision == "kept", refused.outcome
    assert "quality floor" in refused.outcome.reason
    (told,) = hook.bodies
    assert told["decision"] == "kept" and "quality floor" in told["reason"]
    registry = refused.registry
    history = champion_history(registry)
    assert history[-1]["event"] == "refused" and "quality floor" in history[-1]["reason"]
    assert len(history) == 3
    assert refused.report is not None and "quality floor" in Path(refused.report).read_text()
    before = champion_status(registry).champion
    _champion_answers(registry, source, tmp_path / "refused")

    with WebhookReceiver() as hook:
        nothing_new = run_local(
            root=root, log_path=str(tmp_path / "again.log"), notify_webhook=hook.url, **settings
        )
    assert nothing_new.data == "skip" and nothing_new.report is None
    (told,) = hook.bodies
    assert told["decision"] == "skipped" and "no new data since" in told["reason"]
    assert len(champion_history(registry)) == 3  # nothing decided, nothing recorded
    assert champion_status(registry).champion == before


def _challenger_card(pipeline_root: str) -> dict:
    """The model card of the run's warm-started candidate (the only one with an ``init``)."""
    (card,) = [
        _card(str(path.parent)) for task in ("train-model", "tune-model")
        for path in Path(pipeline_root).glob(f"*/{task}/model/model.json") if _card(str(path.parent))["init"]
    ]  # fmt: skip
    return card


def _default_peak_lr(scenario: Scenario) -> float:
    """The peak LR a run without --lr trains at: the scaled default, fine-tuning's rule when fine-tuning."""
    from tpustream.models import model_spec
    from tpustream.train.optimizer import default_peak_lr, fine_tune_peak_lr

    spec = model_spec("resnet18")
    if scenario.weights == "staged-pth":
        return fine_tune_peak_lr(GLOBAL_BATCH, spec)
    return default_peak_lr(GLOBAL_BATCH, spec.base_lr)
