"""WebDataset shards written by other tools as a SOURCE: stock ``webdataset.ShardWriter`` output (PAX headers,
jpg/png/webp, .cls and .json labels) re-sharded into our layout; bad samples counted, never raised."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import webdataset as wds
from PIL import Image
from typer.testing import CliRunner

from tests.common.sources import encoded_image as _encoded
from tests.common.sources import gzip_shards, write_stock_shards
from tests.common.sources import noise_pixels as _pixels
from tpustream.cli.main import app
from tpustream.dataset import fingerprint
from tpustream.dataset.manifest import read_manifest, verify_shards
from tpustream.dataset.plan import ShardConfig
from tpustream.dataset.write import create_shards
from tpustream.sources.dispatch import open_source, source_kind
from tpustream.sources.types import SourceError


def test_stock_shardwriter_shards_are_resharded_with_their_splits_labels_and_pixels(tmp_path):
    src = str(tmp_path / "theirs")
    (tmp_path / "theirs").mkdir()
    seeds = write_stock_shards(src)
    assert source_kind(src) == "directory"  # told apart from an ImageFolder when listed
    source = open_source(src)
    assert source.classes == ["0", "1", "2"] and len(source.items) == 36 and not source.rejected
    assert {item.split for item in source.items} == {"train", "val"}

    out = str(tmp_path / "ours")
    manifest, _ = create_shards(ShardConfig(source=src, output=out, num_shards=2), progress=False)
    assert manifest.splits["train"].class_counts == [6, 6, 6]
    assert manifest.splits["val"].class_counts == [6, 6, 6]
    assert manifest.classes == ["0", "1", "2"] and manifest.skipped.count == 0
    verify_shards(out)

    # stock webdataset reads our shards back: jpg and png keep their bytes, webp became png of the same pixels
    index = {}
    for line in (tmp_path / "ours" / "index").glob("*.jsonl"):  # keys are unique within a split
        for row in line.read_text().splitlines():
            entry = json.loads(row)
            index[line.name.split("-")[0], entry["key"]] = entry["source"]
    seen = 0
    for shard in manifest.splits["train"].shards + manifest.splits["val"].shards:
        split = shard.path.split("/")[0]
        for sample in wds.WebDataset(f"{out}/{shard.path}", shardshuffle=False):
            their_key = index[split, sample["__key__"]].split("#", 1)[1]
            seed, kind = seeds[their_key], int(their_key[-5:]) % 3
            assert int(sample["cls"]) == kind
            if kind == 0:
                assert sample["jpg"] == _encoded(seed, "JPEG", quality=95)
            elif kind == 1:
                assert sample["png"] == _encoded(seed, "PNG")
            else:
                assert np.array_equal(np.asarray(Image.open(io.BytesIO(sample["png"]))), _pixels(seed))
            seen += 1
    assert seen == 36


def test_every_form_of_naming_the_tars_lists_the_same_samples_and_the_fingerprint_follows_them(tmp_path):
    seeds = write_stock_shards(str(tmp_path))
    assert len(seeds) == 36
    forms = [
        str(tmp_path),
        f"{tmp_path}/train-*.tar,{tmp_path}/val-*.tar",
        f"{tmp_path}/train-{{0000..0002}}.tar,{tmp_path}/val-{{0000..0002}}.tar",
        ",".join(f"{tmp_path}/{s}-{i:04d}.tar" for s in ("train", "val") for i in range(3)),
    ]
    refs = [sorted(str(item.ref) for item in open_source(form).items) for form in forms]
    assert all(r == refs[0] for r in refs) and len(refs[0]) == 36
    assert all(source_kind(form) == "shards" for form in forms[1:])

    config = ShardConfig(source=forms[2], output=str(tmp_path / "out"))
    before = fingerprint.fingerprint(config, fingerprint.source_objects(forms[2]))
    assert fingerprint.fingerprint(config, fingerprint.source_objects(forms[2])) == before
    with wds.TarWriter(f"{tmp_path}/val-0002.tar") as writer:  # another tool rewrote one shard
        writer.write({"__key__": "val/new", "jpg": _encoded(7, "JPEG"), "cls": 1})
    assert fingerprint.fingerprint(config, fingerprint.source_objects(forms[2])) != before


def _tar(path: str, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_bad_samples_and_a_damaged_tar_are_counted_by_reason_never_raised(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    good = [(f"a{i}.png", _encoded(i, "PNG")) for i in range(6)]
    _tar(
        str(src / "part-0.tar"),
        [
            *(
                m
                for i, (name, data) in enumerate(good)
                for m in ((name, data), (f"a{i}.cls", b"cat dog"[:3]))
            ),
            ("b0.cls", b"1"),  # no image member
            ("b1.png", _encoded(50, "PNG")),  # no label at all
            ("b2.png", _encoded(51, "PNG")),
            ("b2.json", b"{not json"),
            ("b3.png", _encoded(52, "PNG")),
            ("b3.json", json.dumps({"label": [1, 2]}).encode()),  # multi-label: not ours
            ("b4.jpg", b"\xff\xd8 not a jpeg"),  # listed fine, undecodable when written
            ("b4.cls", b"dog"),
            *((f"d{i}.png", _encoded(60 + i, "PNG")) for i in range(1)),
            ("d0.cls", b"dog"),
        ],
    )
    (src / "part-1.tar").write_bytes((src / "part-0.tar").read_bytes()[:3000])  # cut inside a member
    source = open_source(str(src))
    reasons = sorted(r.reason for r in source.rejected)
    assert reasons == [
        "empty-label",
        "malformed-sample",
        "malformed-sample",
        "malformed-sample",
        "malformed-sample",
    ]
    damaged = next(r for r in source.rejected if r.ref.endswith("part-1.tar"))
    assert "damaged tar" in damaged.message
    assert source.classes == ["cat", "dog"]  # names as written, ordered by name

    manifest, summary = create_shards(
        ShardConfig(source=str(src), output=str(tmp_path / "out"), num_shards=1), progress=False
    )
    # the undecodable image is skipped; the 5 rejected samples were never loaded
    assert "1 skipped, 5 rows rejected, 0 shards kept" in summary.line()
    skipped = manifest.skipped
    assert skipped.by_reason == {"malformed-sample": 4, "empty-label": 1, "undecodable": 1}
    assert skipped.count == 6 and skipped.rejected_rows == 5
    assert any("part-0.tar#b4" in example for example in skipped.examples)
    total = sum(info.num_samples for info in manifest.splits.values())
    assert total == 7  # a0..a5 and d0 in part-0; part-1's first sample survives only if complete
    assert len(read_manifest(str(tmp_path / "out"))["splits"]) == 2

    result = CliRunner().invoke(
        app, ["shards", "create", "--source", str(src), "--output", str(tmp_path / "strict"), "--strict"]
    )
    assert result.exit_code != 0
    assert "--strict: 5 row(s)" in result.output and "Traceback" not in result.output


def test_names_without_a_split_word_go_through_val_fraction(tmp_path):
    for i in range(2):
        _tar(
            str(tmp_path / f"shard-{i}.tar"),
            [
                m
                for j in range(10)
                for m in (
                    (f"k{i}{j}.png", _encoded(i * 10 + j, "PNG")),
                    (f"k{i}{j}.cls", str(j % 2).encode()),
                )
            ],
        )
    source = open_source(str(tmp_path))
    assert all(item.split is None for item in source.items)
    manifest, _ = create_shards(
        ShardConfig(source=str(tmp_path), output=str(tmp_path / "out"), num_shards=1, val_fraction=0.2),
        progress=False,
    )
    assert manifest.splits["val"].class_counts == [2, 2]


def test_no_tar_or_no_labelled_sample_is_one_clear_error(tmp_path):
    with pytest.raises(SourceError, match=r"no file matches"):
        open_source(f"{tmp_path}/nothing-*.tar")
    _tar(str(tmp_path / "x.tar"), [("a.png", _encoded(1, "PNG"))])
    with pytest.raises(
        SourceError, match=r"no labelled image sample in 1 tar file\(s\); e.g. .*x.tar#a: no label"
    ):
        open_source(str(tmp_path / "x.tar"))


def test_shards_that_all_say_train_give_a_warned_dataset_without_val(tmp_path, caplog):
    src = tmp_path / "src"
    src.mkdir()
    _tar(
        str(src / "train-0.tar"),
        [
            m
            for j in range(8)
            for m in ((f"k{j}.png", _encoded(j, "PNG")), (f"k{j}.cls", str(j % 2).encode()))
        ],
    )
    with caplog.at_level("WARNING"):
        manifest, _ = create_shards(
            ShardConfig(source=str(src), output=str(tmp_path / "out"), num_shards=1), progress=False
        )
    assert list(manifest.splits) == ["train"]
    assert "no val split" in caplog.text and "--val-fraction" in caplog.text


# --------------------------------------------------------------------------- one meaning per label

SHAPES = ["circle", "square", "triangle"]


def write_mixed_label_shards(directory: str, *, per_split: int = 12) -> None:
    """train-NNNN.tar with integer .cls labels, val-NNNN.tar with .json {"label": name}: class i % 3 both."""
    for split in ("train", "val"):
        with wds.ShardWriter(f"{directory}/{split}-%04d.tar", maxcount=5, verbose=0) as writer:
            for i in range(per_split):
                label = {"cls": i % 3} if split == "train" else {"json": {"label": SHAPES[i % 3]}}
                writer.write({"__key__": f"{split}{i:04d}", "png": _encoded(i, "PNG"), **label})


def test_integer_and_named_labels_together_are_refused_naming_the_shards(tmp_path):
    write_mixed_label_shards(str(tmp_path))
    with pytest.raises(SourceError) as caught:
        open_source(str(tmp_path))
    message = str(caught.value)
    assert "mixes integer labels (0, 1, 2 in train-0000.tar, train-0001.tar, train-0002.tar)" in message
    assert "class names (circle, square, triangle in val-0000.tar, val-0001.tar, val-0002.tar)" in message
    assert "--class-names" in message
    result = CliRunner().invoke(
        app,
        ["shards", "create", "--source", str(tmp_path), "--output", str(tmp_path / "out"), "--workers", "1"],
    )
    assert result.exit_code == 2 and "mixes integer labels" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "out" / "manifest.json").exists()


def test_class_names_map_integer_labels_so_both_forms_make_one_set_of_classes(tmp_path):
    (tmp_path / "shards").mkdir()
    write_mixed_label_shards(str(tmp_path / "shards"))
    names = tmp_path / "classes.txt"
    names.write_text("circle\nsquare\n\ntriangle\n")  # a blank line is no name
    out = tmp_path / "out"
    args = ["shards", "create", "--source", str(tmp_path / "shards"), "--output", str(out), "--workers", "1"]
    result = CliRunner().invoke(app, [*args, "--class-names", str(names)])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(str(out))
    assert manifest["classes"] == SHAPES
    assert manifest["splits"]["train"]["class_counts"] == [4, 4, 4]  # integers 0, 1, 2 -> the three names
    assert manifest["splits"]["val"]["class_counts"] == [4, 4, 4]  # names -> the same three classes
    same = open_source(str(tmp_path / "shards"), class_names="circle,square,triangle")
    assert same.classes == SHAPES and len(same.items) == 24


@pytest.mark.parametrize(
    "class_names, message",
    [
        ("circle,square", r"integer label 2 has no name: --class-names gives 2 \(indices 0..1\)"),
        (
            "circle,square,triangel",
            r"label 'triangle' is not one of --class-names \(circle, square, triangel\)",
        ),
    ],
)
def test_class_names_refuse_an_integer_out_of_range_or_a_name_not_listed(tmp_path, class_names, message):
    write_mixed_label_shards(str(tmp_path))
    with pytest.raises(SourceError, match=message):
        open_source(str(tmp_path), class_names=class_names)


def test_class_names_name_any_source_and_bad_lists_are_config_errors(tmp_path):
    from tpustream.errors import ConfigError

    words = "zero,one,two,three,four,five,six,seven,eight,nine"
    digits = open_source("digits", class_names=words)
    plain = open_source("digits")
    assert digits.classes == words.split(",")
    assert [item.label for item in digits.items] == [item.label for item in plain.items]
    with pytest.raises(ConfigError, match="a listed twice"):
        ShardConfig(output=str(tmp_path), class_names="a,b,a")
    with pytest.raises(ConfigError, match="'' is not a class name"):
        ShardConfig(output=str(tmp_path), class_names="a,,b")
    with pytest.raises(ConfigError, match="no such file"):
        open_source("digits", class_names=str(tmp_path / "missing.txt"))


# --------------------------------------------------------------------------- gzip-compressed shards


@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz"])
def test_gzip_compressed_shards_read_as_the_plain_ones(tmp_path, monkeypatch, suffix):
    from tpustream.sources import gzip_index

    monkeypatch.setattr(gzip_index, "CHECKPOINT_SPACING", 4096)  # many restart points in these small shards
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    write_stock_shards(str(plain))
    packed.mkdir()
    for tar in plain.glob("*.tar"):
        (packed / tar.name).write_bytes(tar.read_bytes())
    gzip_shards(packed, suffix=suffix)
    for name in ("train-0000", "val-0002"):  # webdataset itself reads them: they are what it calls shards
        assert len(list(wds.WebDataset(f"{packed}/{name}{suffix}", shardshuffle=False))) > 0
    expected, source = open_source(str(plain)), open_source(str(packed))
    assert source.classes == expected.classes and not source.rejected
    assert [
        str(item.ref).replace(suffix, ".tar").replace("/packed/", "/plain/") for item in source.items
    ] == [item.ref for item in expected.items]
    assert [(item.label, item.split) for item in source.items] == [(i.label, i.split) for i in expected.items]
    for item, same in zip(source.items, expected.items, strict=True):
        assert source.load(item) == expected.load(same)
    pattern = f"{packed}/train-*{suffix},{packed}/val-{{0000..0002}}{suffix}"
    assert source_kind(pattern) == "shards" and len(open_source(pattern).items) == 36
    manifest, _ = create_shards(ShardConfig(source=str(packed), output=str(tmp_path / "out"), num_shards=2))
    assert manifest.splits["train"].class_counts == [6, 6, 6] and manifest.skipped.count == 0


def test_a_truncated_gzip_shard_is_counted_damaged(tmp_path):
    write_stock_shards(str(tmp_path))
    gzip_shards(tmp_path)
    whole = (tmp_path / "val-0000.tar.gz").read_bytes()
    (tmp_path / "val-0000.tar.gz").write_bytes(whole[: len(whole) // 2])
    source = open_source(str(tmp_path))
    [damaged] = [r for r in source.rejected if r.ref.endswith("val-0000.tar.gz")]
    assert damaged.reason == "malformed-sample" and "gzip stream ends early" in damaged.message
    assert len(source.items) < 36


def test_renamed_classes_are_another_plan(tmp_path):
    from tpustream.dataset.plan import plan_dataset

    def fingerprints(class_names: str | None) -> list[str]:
        config = ShardConfig(source="digits", output=str(tmp_path), class_names=class_names)
        return [
            shard.fingerprint
            for shard in plan_dataset(open_source("digits", class_names=class_names), config).shards
        ]

    words = [f"d{i}" for i in range(10)]
    assert fingerprints(None) == fingerprints(None)
    # a resumed run must not reuse shards whose records count samples under the other names
    assert set(fingerprints(",".join(words))).isdisjoint(fingerprints(",".join(reversed(words))))


def test_shards_named_test_are_the_test_split_and_written_as_its_own_shards(tmp_path):
    for name, first in (("train-0000", 0), ("validation-0000", 100), ("testing-0000", 200)):
        _tar(
            str(tmp_path / f"{name}.tar"),
            [
                m
                for j in range(8)
                for m in ((f"k{j}.png", _encoded(first + j, "PNG")), (f"k{j}.cls", str(j % 2).encode()))
            ],
        )
    source = open_source(str(tmp_path))
    by_split = {
        split: sum(item.split == split for item in source.items) for split in ("train", "val", "test")
    }
    assert by_split == {"train": 8, "val": 8, "test": 8}
    assert "(8 train / 8 val / 8 test / 0 unassigned)" in source.description
    manifest, summary = create_shards(
        ShardConfig(source=str(tmp_path), output=str(tmp_path / "out"), num_shards=1), progress=False
    )
    assert summary.split_samples == {"train": 8, "val": 8, "test": 8}
    assert manifest.splits["test"].class_counts == [4, 4]
    assert [shard.path for shard in manifest.splits["test"].shards] == ["test/test-000000.tar"]
