"""``tpustream bench load``: every pipeline, the ceilings and the skipped peers come out as JSON lines."""

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from tpustream.bench_load import bench_load
from tpustream.cli import app

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_one_line_per_pipeline_and_worker_count_with_ratios_to_tpustream():
    lines = [json.loads(line) for line in bench_load(
        data="synthetic-cifar:400", split="train", batch_size=16, workers=[0, 1], seconds=0.2, repeats=1,
        input_size=None,
    )]  # fmt: skip
    measured = [line for line in lines if "skipped" not in line]
    by_workers = {
        count: {line["pipeline"]: line for line in measured if line["workers"] == count} for count in (0, 1)
    }
    assert {"tpustream", "A-per-file-imagefolder", "B-blog-webdataset", "webdataset-webloader",
            "webdataset-webloader+our-decoder"} <= set(by_workers[1])  # fmt: skip
    assert {"kernel-alone", "tpustream-workers0"} <= set(by_workers[0])  # the ceilings, measured once
    assert all(line["samples_per_s"] > 0 and line["input_size"] == 32 for line in measured)
    ours = by_workers[1]["tpustream"]
    assert ours["ratio_vs_tpustream"] == 1.0 and ours["fraction_of_kernel_x_cores"] > 0
    together = by_workers[1]["kernel-in-1-processes"]  # the kernel in as many processes as cores used
    assert together["ceiling"] and together["samples_per_s"] > 0
    assert ours["fraction_of_kernel_in_processes"] == round(
        ours["samples_per_s"] / together["samples_per_s"], 2
    )
    peer = by_workers[1]["webdataset-webloader+our-decoder"]
    assert abs(peer["ratio_vs_tpustream"] - peer["samples_per_s"] / ours["samples_per_s"]) < 0.02
    skipped = {line["pipeline"]: line["skipped"] for line in lines if "skipped" in line}
    for peer, module in (("litdata", "litdata"), ("grain", "grain"), ("mosaic-streaming", "streaming")):
        if importlib.util.find_spec(module) is None:
            assert skipped[peer].startswith(f"{module} not installed: pip install -e '.[bench"), peer
            continue
        for name in (peer, f"{peer}+our-decoder"):  # its documented pipeline and its plumbing with ours
            for count in (0, 1):
                line = by_workers[count][name]
                assert line["samples_per_s"] > 0, name
                assert {"ratio_vs_tpustream", "ratio_vs_B", "ratio_vs_A"} <= set(line), name


@pytest.mark.slow
def test_the_kernel_runs_in_that_many_processes_at_once(tmp_path):
    from tpustream import shards
    from tpustream.bench_load import _kernel_in_processes, _resolve_dataset

    dataset = _resolve_dataset("synthetic-cifar:300", str(tmp_path))
    rates = _kernel_in_processes((dataset, shards.read_manifest(dataset), "train", 32, 16), 2, 0.3)
    assert len(rates) == 2 and all(rate > 0 for rate in rates)


def test_workers_takes_a_list_and_refuses_anything_else():
    result = CliRunner().invoke(app, ["bench", "load", "--workers", "1,x"])
    assert result.exit_code == 2 and "--workers takes counts like 2 or 1,2,4" in result.output
