"""The scenario suite: the pipeline through kfp.local in the combinations a user runs, not one feature at a
time (issue 42, item 7). Each axis is a feature; a new feature adds its axis to ``AXES`` (the way torchtitan's
``tests/integration_tests/features.py`` lists flag combinations that one launcher runs).

A chain is one registry's life: a first run, then a warm-started challenger (``init_from=champion``, the
pipeline's default) on the same data (``retrain=true``). After each run the champion answers through
``tpustream predict`` and through the real model server, and what the history, the run report and the webhook
say is checked. The cheapest chain goes on with a refused challenger (a quality floor) and a nothing-new run.

Axes:
- weights: ``random`` (random init) or ``staged-pth`` (a torchvision-layout resnet18 ``.pth`` on gs://, the
  GCS-API server on loopback: the pretrained weights a user stages; random values stand in for ImageNet's).
- input size: 32 px (small: a random-init resnet gets the small-input stem, a fine-tuned one keeps its stock
  stem) or 96 px (full size: the stock stem either way).

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
from typing import Literal

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
AXES: dict[str, tuple[object, ...]] = {"weights": ("random", "staged-pth"), "input_size": (32, 96)}
CLASSES = 4  # digits 0-3 (the staged weights were trained on 4-9)
PRETRAIN_STEPS = 60  # the staged weights' training: plain torch on the CPU, seconds


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

    @property
    def id(self) -> str:
        return f"{self.weights}-{self.input_size}px"

    @property
    def small_input_stem(self) -> bool:
        """The stem every reader must build: the small-input one for random weights under 96 px only."""
        return self.weights == "random" and self.input_size < 96


SCENARIOS = [Scenario(w, s) for w in AXES["weights"] for s in AXES["input_size"]]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """An image folder of digits 0-3 per weights axis (its Budget's images)."""
    made = {}
    for weights, budget in BUDGETS.items():
        root = tmp_path_factory.mktemp(f"scenario-{weights}") / "digits"
        digit_images(root, 0, budget.images, classes=range(CLASSES))
        made[weights] = str(root)
    return made


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


def _settings(scenario: Scenario, source: str, weights_uri: str) -> dict[str, object]:
    budget = BUDGETS[scenario.weights]
    return dict(
        source=source,
        model_name="resnet18",
        input_size=scenario.input_size,
        pretrained=weights_uri if scenario.weights == "staged-pth" else "",
        epochs=budget.epochs,
        beat_majority_baseline=budget.beat_majority_baseline,
        batch_size=8,  # per device, 4 virtual XLA devices
        num_shards=4,
        shards_per_task=4,
        test_fraction=0.2,  # the held-out split decides, as a user's import file with a test split
        bf16=False,
        workers=1,
    )


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
def test_first_run_then_a_warm_started_challenger(scenario, sources, staged_weights, tmp_path):
    from tpustream.pipelines.local import run_local

    source = sources[scenario.weights]
    root = str(tmp_path / "run")
    settings = _settings(scenario, source, staged_weights)
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
    assert card["peak_lr"] == pytest.approx(_default_peak_lr(scenario))  # the door's default: no --lr given
    (told,) = hook.bodies
    assert told["state"] == "SUCCEEDED" and told["decision"] == "promoted"
    if BUDGETS[scenario.weights].beat_majority_baseline:  # it beat always answering the largest class
        assert told["candidate_value"] > told["baseline_value"], told
    assert told["baseline_value"] is not None  # measured and told either way
    page = Path(first.report).read_text()
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
    (told,) = hook.bodies
    assert told["state"] == "SUCCEEDED" and told["decision"] == second.outcome.decision
    history = champion_history(registry)
    assert [entry["event"] for entry in history][0] == "promoted"
    assert len(history) == 2  # the first promotion and the challenger's decision, whichever it was
    _champion_answers(registry, source, tmp_path / "second")
    if scenario == Scenario("random", 32):  # the cheapest chain goes on
        _refused_then_nothing_new(root, settings, source, tmp_path)


def _refused_then_nothing_new(root: str, settings: dict[str, object], source: str, tmp_path: Path) -> None:
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
        _card(d) for d, _, files in os.walk(pipeline_root) if "model.json" in files and "train-model" in d
        and _card(d)["init"] is not None
    ]  # fmt: skip
    return card


def _default_peak_lr(scenario: Scenario) -> float:
    """The peak LR a run without --lr trains at: the scaled default, fine-tuning's rule when fine-tuning."""
    from tpustream.models import model_spec
    from tpustream.train.optimizer import default_peak_lr, fine_tune_peak_lr

    spec = model_spec("resnet18")
    if scenario.weights == "staged-pth":
        return fine_tune_peak_lr(8 * 4, spec)
    return default_peak_lr(8 * 4, spec.base_lr)
