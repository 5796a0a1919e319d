"""The run report's mistakes gallery (tpustream/report/mistakes.py): which mistakes are shown, thumbnails read
from the shards that hold them, and the section's page (every thumbnail a JPEG that decodes)."""

import base64
import io
import re

from PIL import Image

from tests.common.report import EVIL, sample_facts
from tpustream.dataset.manifest import iter_sample_index, load_manifest
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.write import create_shards
from tpustream.report.build import render_report
from tpustream.report.mistakes import Mistake, pick_mistakes, thumbnails
from tpustream.storage import io as storage


def _mistake(key, true_class, confidence, predicted="x"):
    return Mistake(key=key, source=f"src/{key}.png", true_class=true_class, predicted_class=predicted,
                   confidence=confidence)  # fmt: skip


def test_the_surest_mistakes_of_every_class_are_picked_in_turn_within_the_bounds():
    rows = [_mistake(f"a{i}", "a", 0.9 - i / 100) for i in range(10)]  # one class with many mistakes
    rows += [_mistake("b0", "b", 0.4), _mistake("b1", "b", 0.6), _mistake("c0", "c", 0.99)]
    picked = pick_mistakes(rows, per_class=3, limit=6)
    # each class's surest first, classes in turn: the class with ten mistakes does not crowd out the others
    assert [m.key for m in picked] == ["a0", "b1", "c0", "a1", "b0", "a2"]
    assert pick_mistakes(rows, per_class=3, limit=100) == picked + []  # 3 + 2 + 1 in all
    ties = [_mistake("k2", "a", 0.5), _mistake("k1", "a", 0.5)]
    assert [m.key for m in pick_mistakes(ties)] == ["k1", "k2"]  # the same choice on every run
    assert pick_mistakes([]) == []


def test_thumbnails_come_from_the_shards_that_hold_the_samples_and_decode(tmp_path):
    data = str(tmp_path / "digits")
    create_shards(
        ShardConfig(source="digits", output=data, num_shards=2, val_fraction=0.2, val_shards=3),
        progress=False,
    )
    manifest = load_manifest(data)
    entries = list(iter_sample_index(data, manifest, "val"))
    val_shards = manifest.split("val").shards
    assert len(val_shards) >= 2
    first_shard_keys = {e.key for e in entries[: val_shards[0].num_samples]}
    wanted = sorted(first_shard_keys)[:3]
    for shard in val_shards[1:]:  # shards that hold no wanted sample are never opened
        storage.delete(storage.join(data, shard.path))
    found = thumbnails(data, manifest, "val", [*wanted, "no-such-key"])
    assert sorted(found) == wanted
    for uri in found.values():
        assert uri.startswith("data:image/jpeg;base64,")
        image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])), formats=["JPEG"])
        image.load()
        assert max(image.size) >= 64  # an 8 px digit is scaled up to be seen
    assert thumbnails(data, manifest, "val", []) == {}


def test_the_report_shows_the_mistakes_with_escaped_names_and_decodable_pictures(tmp_path):
    picture = io.BytesIO()
    Image.new("RGB", (12, 10), (200, 30, 30)).save(picture, "JPEG")
    data_uri = "data:image/jpeg;base64," + base64.b64encode(picture.getvalue()).decode()
    mistakes = [_mistake("k1", EVIL, 0.93, predicted="dog"), _mistake("k2", "cat", 0.5)]
    page, _ = render_report(sample_facts(mistakes=mistakes, thumbnails={"k1": data_uri}))
    section = page.split('<section id="mistakes">', 1)[1].split("</section>", 1)[0]
    assert EVIL not in page and "&lt;script&gt;" in section and "93.0%" in section
    assert section.count('<figure class="mistake">') == 2 and "no picture" in section  # k2 has none
    for uri in re.findall(r'<img src="(data:image/jpeg;base64,[^"]+)"', section):
        Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])), formats=["JPEG"]).load()
    assert '<a href="#mistakes">' in page
    none_page, _ = render_report(sample_facts(mistakes=[]))
    assert "classified every evaluated sample correctly" in none_page
    assert '<section id="mistakes">' not in render_report(sample_facts())[0]  # no scores: no section
