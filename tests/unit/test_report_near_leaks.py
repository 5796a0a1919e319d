"""The run report's near-duplicates across splits (tpustream/report/near_leaks.py) on a dataset made with
create_shards from scikit-image's photos, with re-saved and resized copies of train photos in val and test: the
check-data step writes its JSON beside its Markdown, the report reads the pairs from it and shows each held-out
image beside its train image (both thumbnails from the shards), with the distance and both sources; no section
without pairs, without the JSON (a step before it) or with a damaged one."""

import os

import pytest

from tests.common.photos import photo_folder
from tests.common.report import EVIL, sample_facts
from tpustream.dataset import write as shards
from tpustream.dataset.check import DataCheckThresholds, check_dataset
from tpustream.dataset.check_result import data_check_json_uri
from tpustream.dataset.manifest import load_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.report.build import render_report
from tpustream.report.near_leaks import NearLeaksGallery, near_leaks_gallery, near_leaks_html
from tpustream.run.data_gate import check_for_pipeline

JPEG = "data:image/jpeg;base64,"


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """The photos dataset checked as the pipeline's check-data step does under data_check=warn."""
    tmp = tmp_path_factory.mktemp("near-report")
    root = photo_folder(tmp / "photos")
    uri = str(tmp / "dataset")
    shards.create_shards(ShardConfig(source=str(root), output=uri, num_shards=2), progress=False)
    report_path = str(tmp / "check-data" / "report")
    result = check_for_pipeline(
        uri, registry="", mode="warn", thresholds=DataCheckThresholds(), report_path=report_path
    )
    assert result is not None and "near-leak" in [a.code for a in result.anomalies]
    return uri, report_path, result


def test_the_step_writes_its_json_beside_its_markdown(checked):
    _, report_path, result = checked
    assert data_check_json_uri(report_path) == report_path + ".json"
    assert os.path.exists(report_path) and os.path.exists(report_path + ".json")


def test_each_pair_shows_both_pictures_from_their_splits_shards(checked):
    uri, report_path, result = checked
    manifest = load_manifest(uri)
    gallery = near_leaks_gallery(report_path, uri, manifest)
    assert gallery is not None
    assert gallery.leaked == {"val": 2, "test": 1} and gallery.total == 3 and gallery.max_distance == 8
    found = {
        (p["split"], os.path.basename(p["source"]), os.path.basename(p["train_source"]))
        for p in gallery.pairs
    }
    assert found == {
        ("val", "coffee-resaved.jpg", "coffee.jpg"),
        ("val", "rocket-small.png", "rocket.jpg"),
        ("test", "camera-bigger.jpg", "camera.jpg"),
    }
    for (
        pair
    ) in gallery.pairs:  # every picture read: the held-out key from its split, the train key from train's
        assert gallery.thumbnails[pair["split"]][pair["key"]].startswith(JPEG)
        assert gallery.thumbnails["train"][pair["train_key"]].startswith(JPEG)
    body = near_leaks_html(gallery)
    assert body.count('<div class="near-pair">') == 3 and body.count(f'<img src="{JPEG}') == 6
    assert "3 held-out image(s) (2 val and 1 test) are within 8 bits" in body
    for pair in gallery.pairs:
        assert f"<code>{pair['source']}</code>" in body and f"<code>{pair['train_source']}</code>" in body
        assert f"~ {pair['distance']} bits" in body or f"~ {pair['distance']} bit<" in body
    # the report object itself (tpustream report with a check run in-process) gives the same gallery
    assert near_leaks_gallery(result, uri, manifest) == gallery
    page = render_report(sample_facts(near_leaks=gallery))[0]
    assert '<section id="near-leaks">' in page and "Near-duplicates across splits" in page


def test_no_section_without_pairs_json_or_a_readable_one(checked, tmp_path):
    uri, report_path, _ = checked
    manifest = load_manifest(uri)
    assert '<section id="near-leaks">' not in render_report(sample_facts())[0]
    assert near_leaks_gallery(None, uri, manifest) is None
    assert near_leaks_gallery(str(tmp_path / "older-step-report"), uri, manifest) is None  # no JSON beside
    damaged = tmp_path / "damaged"
    damaged.write_text("# Data check\n")
    (tmp_path / "damaged.json").write_text("{not json")
    assert near_leaks_gallery(str(damaged), uri, manifest) is None
    (tmp_path / "damaged.json").write_text('{"format": "something/v1"}')
    assert near_leaks_gallery(str(damaged), uri, manifest) is None
    exact_only = check_dataset(uri, thresholds=DataCheckThresholds(near_duplicate_distance=-1))
    assert near_leaks_gallery(exact_only, uri, manifest) is None  # near check off: no pairs


def test_names_are_escaped_and_a_pair_without_pictures_still_listed():
    pair = {
        "split": "test",
        "source": EVIL,
        "key": "00000003",
        "train_source": "raw/a & b.jpg",
        "train_key": "00000009",
        "distance": 4,
    }
    gallery = NearLeaksGallery(max_distance=8, leaked={"test": 30}, total=30, pairs=(pair,), thumbnails={})
    body = near_leaks_html(gallery)
    assert EVIL not in body and "&lt;script&gt;" in body and "raw/a &amp; b.jpg" in body
    assert body.count('<div class="nopic">no picture</div>') == 2
    assert "the first 1 shown" in body


def test_build_report_facts_reads_the_pairs_beside_the_steps_markdown(checked, tmp_path):
    """As the evaluate and promote steps call it: the check-data step's Markdown URI in, the section out."""
    import json

    from tpustream.registry.policy import PromotionPolicy
    from tpustream.report.build import build_report_facts

    uri, report_path, _ = checked
    facts = sample_facts()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.json").write_text(json.dumps(facts.model_card.to_json()))
    (tmp_path / "metrics.json").write_text(json.dumps(facts.metrics.to_json()))
    gathered = build_report_facts(
        model_uri=str(tmp_path / "model"),
        metrics_uri=str(tmp_path),
        dataset_uri=uri,
        registry=None,
        policy=PromotionPolicy(),
        data_check=report_path,
    )
    assert gathered.near_leaks is not None and len(gathered.near_leaks.pairs) == 3
    page = render_report(gathered)[0]
    assert '<section id="near-leaks">' in page and page.count('<div class="near-pair">') == 3


def test_the_summary_lists_the_pairs_key_to_train_key_with_the_distance():
    """The Markdown summary lists the page's pairs: val/test key and source -> train key and source, bits."""
    from tpustream.report.markdown import MARKDOWN_NEAR_LEAK_ROWS

    def pair(i, source=None):
        return {
            "split": "test",
            "source": source or f"test/{i}.jpg",
            "key": f"{i:08d}",
            "train_source": f"train/{i}.jpg",
            "train_key": f"{100 + i:08d}",
            "distance": i % 9,
        }

    pairs = (pair(0, EVIL), *(pair(i) for i in range(1, 30)))
    gallery = NearLeaksGallery(max_distance=8, leaked={"val": 0, "test": 30}, total=30, pairs=pairs[:2])
    summary = render_report(sample_facts(near_leaks=gallery))[1]
    section = summary.split("## Near-duplicates across splits\n", 1)[1].split("\n## ", 1)[0]
    assert (
        "2 held-out image(s) (30 test)" not in section
        and "30 held-out image(s) (30 test) within 8 bits" in section
    )
    assert "| split | key | source | train key | train source | bits |" in section
    assert (
        "| test | 00000000 | &lt;script&gt;alert(1)&lt;/script&gt; | 00000100 | train/0.jpg | 0 |" in section
    )
    assert "| test | 00000001 | test/1.jpg | 00000101 | train/1.jpg | 1 |" in section
    assert EVIL not in summary and "the 2 closest listed" in section
    many = NearLeaksGallery(max_distance=8, leaked={"test": 30}, total=30, pairs=pairs)
    rows = [
        line
        for line in render_report(sample_facts(near_leaks=many))[1]
        .split("## Near-duplicates", 1)[1]
        .splitlines()
        if line.startswith("| test | ")
    ]
    assert len(rows) == MARKDOWN_NEAR_LEAK_ROWS == 20
    assert "## Near-duplicates across splits" not in render_report(sample_facts())[1]
