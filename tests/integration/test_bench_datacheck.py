"""``tpustream bench datacheck`` at a small size: the ROC lines of both image sets and the scale line, the
index finding every planted pair and exactly brute force's pairs on the sample."""

import json

import pytest
from typer.testing import CliRunner

from tpustream.cli.main import app
from tpustream.dataset.near_duplicates import DEFAULT_MAX_DISTANCE

pytestmark = pytest.mark.integration


def test_bench_datacheck_prints_roc_and_scale_lines():
    args = ["bench", "datacheck", "--train", "20000", "--test", "2000", "--planted", "50"]
    args += ["--brute-force-sample", "200", "--copied", "20", "--hash-seconds", "0.05"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    costs = [line for line in lines if line["case"] == "hash-cost"]
    assert [line["image"] for line in costs] == ["jpeg-500x375", "jpeg-224x224", "jpeg-32x32", "ppm-32x32"]
    assert all(
        line[key] > 0 for line in costs for key in ("full_decode_us", "hash_bytes_us", "hash_of_draft_us")
    )
    lines = lines[len(costs) :]
    assert [(line["case"], line.get("data")) for line in lines] == [
        ("planted-copies", "digits"),
        ("planted-copies", "photos"),
        ("scale", None),
    ]
    for roc in lines[:2]:
        assert roc["max_distance"] == DEFAULT_MAX_DISTANCE
        assert [point["max_distance"] for point in roc["roc"]] == list(range(17))
        assert roc["copies"] == 5 * 20 and 0 <= roc["recall"] <= 1 and 0 <= roc["false_pair_rate"] <= 1
        assert set(roc["recall_by_kind"]) == {"jpeg-resave", "resize", "shift", "brightness", "format-swap"}
    scale = lines[2]
    assert scale["train_hashes"] == 20000 and scale["test_hashes"] == 2000
    assert scale["planted"] == scale["planted_found"] == 50
    assert scale["same_pairs_as_brute_force_on_sample"] is True
    assert scale["brute_force_s_extrapolated"] == pytest.approx(scale["brute_force_sample_s"] * 10, rel=0.05)
    assert scale["index_peak_mib"] > 0 and scale["ratio_vs_brute_force_extrapolated"] > 0
    # 50 planted pairs inside train; random 64-bit hashes add next to none at 20,000 (about 0.06 expected)
    assert scale["train_clusters_planted"] == 50 and 50 <= scale["train_clusters"] <= 52
