"""``tpustream bench load``: every pipeline, the ceilings and the skipped peers come out as JSON lines."""

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from tpustream.bench.load import bench_load
from tpustream.cli.main import app

pytestmark = pytest.mark.integration

FEED = ("handoff-ceiling", "device-transfer-ceiling", "feed-ceiling")  # at 224 and 32 px, whatever the data


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
    assert all(line["samples_per_s"] > 0 for line in measured)
    assert all(line["input_size"] == 32 for line in measured if line["pipeline"] not in FEED)
    ours = by_workers[1]["tpustream"]
    assert ours["ratio_vs_tpustream"] == 1.0 and ours["fraction_of_kernel_x_cores"] > 0
    together = by_workers[1]["kernel-in-1-processes"]  # the kernel in as many processes as cores used
    assert together["ceiling"] and together["samples_per_s"] > 0
    assert ours["fraction_of_kernel_in_processes"] == round(
        ours["samples_per_s"] / together["samples_per_s"], 2
    )
    feed = {(line["pipeline"], line["input_size"]): line for line in measured if line["pipeline"] in FEED}
    for size in (224, 32):
        line = feed["handoff-ceiling", size]
        assert line["ceiling"] and line["workers"] == 1 and line["samples_per_s"] > 0
    if importlib.util.find_spec("torch_xla") is not None:
        assert {("device-transfer-ceiling", 224), ("feed-ceiling", 32)} <= set(feed)
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
    from tpustream.bench.load import _kernel_in_processes, _resolve_dataset
    from tpustream.dataset.manifest import read_manifest

    dataset = _resolve_dataset("synthetic-cifar:300", str(tmp_path))
    rates = _kernel_in_processes((dataset, read_manifest(dataset), "train", 32, 16), 2, 0.3)
    assert len(rates) == 2 and all(rate > 0 for rate in rates)


def test_workers_takes_a_list_and_refuses_anything_else():
    result = CliRunner().invoke(app, ["bench", "load", "--workers", "1,x"])
    assert result.exit_code == 2 and "--workers takes counts like 2 or 1,2,4" in result.output


def test_the_hand_off_ceiling_runs_shardloaders_own_path_with_workers_that_only_hand_out(tmp_path):
    from tpustream.bench.load import _handoff_batches, _ready_batch, _resolve_dataset
    from tpustream.dataset.manifest import read_manifest

    dataset = _resolve_dataset("synthetic-cifar:64", str(tmp_path))
    manifest = read_manifest(dataset)
    ready = _ready_batch(dataset, manifest, "train", 24, 8)
    assert ready.shape == (8, 3, 24, 24) and ready.any()
    batches = _handoff_batches(dataset, manifest, "train", 24, 8, 2, ready)
    taken = [next(batches) for _ in range(12)]  # more than the 64 samples hold: the epoch is the long one
    batches.close()  # the loader's workers shut down
    for batch in taken:  # copied out of the ring by ShardLoader.epoch, as the trainer gets it
        assert batch["image"].data_ptr() != ready.data_ptr() and bool((batch["image"] == ready).all())
        assert batch["label"].shape == (8,) and bool(batch["mask"].all())


def test_the_feed_lines_carry_their_keys_and_the_v5e_comparison_at_224():
    from tpustream.bench.load import V5E_HOST_NEED_IMG_S, _feed_lines

    base = {"bench": "load", "batch_size": 128, "input_size": 32}
    xla = {"device": "CPU", "devices": 4, "rates": {
        (pipeline, size): rate for pipeline in ("device-transfer-ceiling", "feed-ceiling")
        for size, rate in ((224, 8000.0), (32, 160000.0))}}  # fmt: skip
    lines = list(_feed_lines(base, 128, 2, {224: 40000.0, 32: 800000.0}, xla))
    assert [(line["pipeline"], line["input_size"]) for line in lines] == [
        (pipeline, size) for pipeline in FEED for size in (224, 32)
    ]  # fmt: skip
    for line in lines:
        assert line["ceiling"] and line["note"] and line["main_processes"] == 1 and line["host_cores"] >= 1
        assert line["workers"] == (0 if line["pipeline"] == "device-transfer-ceiling" else 2)
        assert line["ms_per_batch"] == round(1000 * 128 / line["samples_per_s"], 3)
        assert ("headroom" in line) == (line["input_size"] == 224)
    handoff, feed = lines[0], lines[4]
    assert handoff["samples_per_s"] == 40000 and handoff["v5e_host_need_img_s"] == V5E_HOST_NEED_IMG_S
    assert handoff["headroom"] == round(40000 / V5E_HOST_NEED_IMG_S, 2)
    assert feed["headroom"] == 0.8 and feed["device"] == "CPU" and feed["devices"] == 4
    assert "not a PCIe DMA" in feed["note"]
    skipped = list(_feed_lines(base, 128, 2, {224: 1.0, 32: 1.0}, {"error": "boom"}))[2:]
    assert skipped == [{"bench": "load", "pipeline": p, "skipped": "boom"}
                       for p in ("device-transfer-ceiling", "feed-ceiling")]  # fmt: skip


@pytest.mark.slow
def test_the_device_transfer_and_feed_ceilings_measure_on_xla_cpu(tmp_path):
    pytest.importorskip("torch_xla")
    from tpustream.bench.load import FEED_SIZES, _resolve_dataset, _xla_feed
    from tpustream.dataset.manifest import read_manifest

    dataset = _resolve_dataset("synthetic-cifar:64", str(tmp_path))
    result = _xla_feed((dataset, read_manifest(dataset), "train", 8), 1, 0.3, 1)
    assert "error" not in result, result
    assert result["devices"] >= 1 and result["device"]
    assert set(result["rates"]) == {
        (pipeline, size) for pipeline in ("device-transfer-ceiling", "feed-ceiling") for size in FEED_SIZES
    }  # fmt: skip
    assert all(rate > 0 for rate in result["rates"].values())
