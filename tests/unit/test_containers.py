"""No Docker engine here: check the Dockerfiles and the Cloud Build file parse and agree."""

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
    for name in ("cpu", "tpu"):
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


def test_cloudbuild_builds_pushes_and_compiles_against_the_pushed_tags():
    build = yaml.safe_load((ROOT / "containers" / "cloudbuild.yaml").read_text())
    steps = {s["id"]: s for s in build["steps"]}
    pushed = [s["args"][1] for s in build["steps"] if s["args"][0] == "push"]
    assert sorted(pushed) == sorted(build["images"])
    built = [s["args"][s["args"].index("-t") + 1] for s in build["steps"] if s["args"][0] == "build"]
    assert sorted(built) == sorted(build["images"])
    compile_args = steps["compile-pipeline"]["args"]
    assert compile_args[:2] == ["pipeline", "compile"]
    assert compile_args[compile_args.index("--image") + 1] in build["images"]
    assert compile_args[compile_args.index("--tpu-image") + 1] in build["images"]
    assert set(steps["compile-pipeline"]["waitFor"]) == {"push-cpu", "push-tpu"}
