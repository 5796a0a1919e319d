"""No Docker engine here: check the Dockerfiles and the Cloud Build file parse and agree."""

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTIONS = {
    "FROM",
    "RUN",
    "COPY",
    "ENV",
    "WORKDIR",
    "ENTRYPOINT",
    "CMD",
    "ARG",
    "LABEL",
    "USER",
    "EXPOSE",
}


def _instructions(path):
    lines, current = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        part = line.rstrip("\\")
        current = f"{current} {part}" if current else part
        if not raw.rstrip().endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(line.split(None, 1)[0], line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_dockerfiles_are_pinned_and_copy_what_exists():
    for name in ("cpu", "tpu", "serve"):
        steps = _instructions(ROOT / "containers" / name / "Dockerfile")
        assert all(keyword in INSTRUCTIONS for keyword, _ in steps), steps
        assert steps[0][0] == "FROM" and ":" in steps[0][1] and "latest" not in steps[0][1]
        for keyword, args in steps:
            if keyword == "COPY":
                for source in args.split()[:-1]:
                    assert (ROOT / source).exists(), source
        installs = " ".join(args for keyword, args in steps if keyword == "RUN")
        assert (
            "torch==2.9.0" in installs and "torchvision==0.24.0" in installs and "pip install ." in installs
        )
    tpu = " ".join(a for k, a in _instructions(ROOT / "containers" / "tpu" / "Dockerfile") if k == "RUN")
    assert "torch_xla[tpu]==2.9.0" in tpu


def test_cloudbuild_tags_every_build_and_compiles_against_the_pushed_digests():
    text = (ROOT / "containers" / "cloudbuild.yaml").read_text()
    build = yaml.safe_load(text)
    assert "SHORT_SHA" not in json.dumps(build)  # empty for a manual `gcloud builds submit`: an invalid tag
    steps = {s["id"]: s for s in build["steps"]}
    pushed = [s["args"][1] for s in build["steps"] if s["args"][0] == "push"]
    assert sorted(pushed) == sorted(build["images"])
    assert all(image.endswith(":$BUILD_ID") for image in build["images"])
    built = [s["args"][s["args"].index("-t") + 1] for s in build["steps"] if s["args"][0] == "build"]
    assert sorted(built) == sorted(build["images"])
    digests = " ".join(steps["digests"]["args"])
    assert all(f"{{{{index .RepoDigests 0}}}}' {image}" in digests for image in build["images"])
    compile_cmd = " ".join(steps["compile-pipeline"]["args"])
    assert "pipeline compile" in compile_cmd
    assert '--image "$$(cat /workspace/cpu.ref)"' in compile_cmd  # $$: a literal $ for bash, not Cloud Build
    assert '--tpu-image "$$(cat /workspace/tpu.ref)"' in compile_cmd
    assert steps["compile-pipeline"]["waitFor"] == ["digests"]


def test_images_carry_the_exact_kfp_and_the_train_component_entry():
    import kfp

    pins = re.findall(r'^\s*"kfp==([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert pins == [kfp.__version__]  # the YAML compiled here runs this exact kfp in the images
    from kfp.dsl.kfp_config import KFPConfig

    entries = KFPConfig(config_directory=ROOT).get_components()
    assert {k: str(v) for k, v in entries.items()} == {"train_model": "components/train.py"}
    assert (ROOT / entries["train_model"]).exists()
    for name in ("cpu", "tpu"):
        copies = [a for k, a in _instructions(ROOT / "containers" / name / "Dockerfile") if k == "COPY"]
        assert any("kfp_config.ini" in a.split()[:-1] and a.split()[-1] == "./" for a in copies)
        assert "components ./components" in copies


def _env(steps):
    """ENV instructions as a dict (KEY=VALUE pairs, as the serve Dockerfile writes them)."""
    env = {}
    for keyword, args in steps:
        if keyword == "ENV":
            for pair in args.split():
                key, value = pair.split("=", 1)
                env[key] = value
    return env


def test_serve_image_runs_the_cpr_model_server_with_the_predictor_promote_uploads():
    from tpustream.serve.contract import HEALTH_ROUTE, PREDICT_ROUTE, SERVING_ENV, SERVING_PORT
    from tpustream.vertex.model_registry import container_spec

    steps = _instructions(ROOT / "containers" / "serve" / "Dockerfile")
    env = _env(steps)
    assert {k: env[k] for k in SERVING_ENV} == SERVING_ENV  # the image and the uploaded env agree
    assert (env["AIP_HTTP_PORT"], env["AIP_HEALTH_ROUTE"], env["AIP_PREDICT_ROUTE"]) == (
        str(SERVING_PORT), HEALTH_ROUTE, PREDICT_ROUTE)  # fmt: skip
    assert ("EXPOSE", str(SERVING_PORT)) in steps
    entry = json.loads(next(a for k, a in steps if k == "ENTRYPOINT"))
    assert entry == ["python", "-m", "google.cloud.aiplatform.prediction.model_server"]
    spec = container_spec("us-central1-docker.pkg.dev/p/r/serve@sha256:" + "a" * 64)
    assert spec["serving_container_ports"] == [SERVING_PORT]
    assert spec["serving_container_environment_variables"] == SERVING_ENV
    for placeholder in ("", "serve:latest", "us-docker.pkg.dev/PROJECT/tpustream/serve:x"):
        try:
            container_spec(placeholder)
        except ValueError as exc:
            assert "--serving-image" in str(exc) and "cloudbuild.yaml" in str(exc)
        else:
            raise AssertionError(f"{placeholder!r} accepted")
    import importlib

    module = importlib.import_module(SERVING_ENV["PREDICTOR_MODULE"])
    from google.cloud.aiplatform.prediction import Handler, Predictor

    assert issubclass(getattr(module, SERVING_ENV["PREDICTOR_CLASS"]), Predictor)
    handler = importlib.import_module(SERVING_ENV["HANDLER_MODULE"])
    assert issubclass(getattr(handler, SERVING_ENV["HANDLER_CLASS"]), Handler)


def test_cloudbuild_pushes_the_serving_image_and_publishes_its_digest():
    build = yaml.safe_load((ROOT / "containers" / "cloudbuild.yaml").read_text())
    serve = "${_REGION}-docker.pkg.dev/$PROJECT_ID/${_REPO}/serve:$BUILD_ID"
    assert serve in build["images"]
    steps = {s["id"]: s for s in build["steps"]}
    assert steps["build-serve"]["args"][:3] == ["build", "-f", "containers/serve/Dockerfile"]
    assert "> /workspace/serve.ref" in " ".join(steps["digests"]["args"])
    assert "serve.ref" in build["artifacts"]["objects"]["paths"]
