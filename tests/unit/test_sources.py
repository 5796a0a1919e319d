import io
import os
import pickle
import tarfile

import numpy as np
import pytest
from PIL import Image

from tpustream.imagecodec import CorruptImage, decode_ppm, encode_ppm, prepare_image_bytes
from tpustream.sources import SourceError, open_source


def test_digits_is_real_bundled_data():
    source = open_source("digits")
    assert len(source.items) == 1797 and source.classes == [str(d) for d in range(10)]
    data, ext = source.load(source.items[0])
    assert ext == "ppm"
    image = decode_ppm(data)
    assert image.shape == (8, 8, 3) and image.max() > 100  # grey levels scaled to 0..255
    assert not source.has_own_split


def test_ppm_round_trip_matches_pil():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    data = encode_ppm(image)
    assert np.array_equal(decode_ppm(data), image)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), image)


def test_synthetic_cifar_is_deterministic_and_class_dependent():
    source = open_source("synthetic-cifar:20")
    assert [i.label for i in source.items[:12]] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    a = decode_ppm(source.load(source.items[3])[0])
    assert a.shape == (32, 32, 3)
    assert np.array_equal(a, decode_ppm(source.load(source.items[3])[0]))
    means = [decode_ppm(source.load(source.items[k])[0]).reshape(-1, 3).mean(0) for k in range(10)]
    assert len({tuple(np.round(m / 20)) for m in means}) > 5  # colour carries the class


def test_synthetic_imagenet_makes_photo_jpegs():
    source = open_source("synthetic-imagenet:3")
    data, ext = source.load(source.items[1])
    assert ext == "jpg" and 20_000 < len(data) < 400_000
    assert Image.open(io.BytesIO(data)).size == (500, 375)
    small, ext = source.load(source.items[1], max_side=128)
    assert ext == "jpg" and max(Image.open(io.BytesIO(small)).size) == 128


@pytest.mark.parametrize(
    "spec", ["nonsense", "synthetic-cifar:0", "synthetic-cifar:x", "cifar10:", "s3://b/x"]
)
def test_bad_source_specs(spec):
    with pytest.raises(SourceError):
        open_source(spec)


def test_pipe_source_refused():
    with pytest.raises(SourceError, match="pipe:"):
        open_source("pipe:cat /etc/passwd")


# --------------------------------------------------------------------------- CIFAR-10


def _write_cifar(directory, per_batch=20):
    """Write batches in the official layout (dicts with bytes keys, protocol 2)."""
    rng = np.random.default_rng(1)
    os.makedirs(directory, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(x) for x in rng.integers(0, 10, per_batch)],
            b"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(per_batch)],
        }
        with open(os.path.join(directory, name), "wb") as f:
            pickle.dump(batch, f, protocol=2)
    with open(os.path.join(directory, "batches.meta"), "wb") as f:
        names = [
            b"airplane",
            b"automobile",
            b"bird",
            b"cat",
            b"deer",
            b"dog",
            b"frog",
            b"horse",
            b"ship",
            b"truck",
        ]
        pickle.dump({b"label_names": names, b"num_cases_per_batch": per_batch}, f, protocol=2)


def test_cifar10_dir_and_targz(tmp_path):
    _write_cifar(tmp_path / "cifar-10-batches-py")
    source = open_source(f"cifar10:{tmp_path}")
    assert len(source.items) == 120 and source.classes[0] == "airplane"
    assert sum(i.split == "val" for i in source.items) == 20
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    expected = batch[b"data"][3].reshape(3, 32, 32).transpose(1, 2, 0)
    assert np.array_equal(decode_ppm(source.load(source.items[3])[0]), expected)
    assert source.items[3].label == batch[b"labels"][3]
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    from_tar = open_source(f"cifar10:{archive}")
    assert [i.label for i in from_tar.items] == [i.label for i in source.items]


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_crafted_cifar_pickle_is_rejected_without_running(tmp_path):
    marker = tmp_path / "pwned"
    directory = tmp_path / "cifar"
    _write_cifar(directory)
    with open(directory / "data_batch_1", "wb") as f:
        pickle.dump({b"data": _Evil(marker), b"labels": []}, f, protocol=2)
    with pytest.raises(SourceError, match="refusing to load"):
        open_source(f"cifar10:{directory}")
    assert not marker.exists()


def test_cifar10_missing_batches(tmp_path):
    with pytest.raises(SourceError, match="no data_batch"):
        open_source(f"cifar10:{tmp_path}")


# --------------------------------------------------------------------------- ImageFolder


def _jpeg(color, size=(40, 30)):
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="JPEG")
    return out.getvalue()


def make_image_folder(root, per_class=4, classes=("cat", "dog")):
    for c, name in enumerate(classes):
        os.makedirs(root / name, exist_ok=True)
        for i in range(per_class):
            (root / name / f"{i}.jpg").write_bytes(_jpeg((c * 100, i * 40, 0)))
    return root


def test_image_folder_keeps_original_bytes(tmp_path):
    root = make_image_folder(tmp_path / "data")
    (root / "cat" / "notes.txt").write_text("not an image")
    source = open_source(str(root))
    assert source.classes == ["cat", "dog"] and len(source.items) == 8
    assert source.ignored == ["cat/notes.txt"]
    item = source.items[0]
    data, ext = source.load(item)
    assert ext == "jpg" and data == (root / str(item.ref)).read_bytes()


def test_image_folder_own_split(tmp_path):
    make_image_folder(tmp_path / "data" / "train")
    make_image_folder(tmp_path / "data" / "val", per_class=2)
    source = open_source(str(tmp_path / "data"))
    assert source.has_own_split and source.classes == ["cat", "dog"]
    assert sum(i.split == "val" for i in source.items) == 4


def test_image_folder_empty_class_and_empty_source(tmp_path):
    root = make_image_folder(tmp_path / "data")
    os.makedirs(root / "bird")
    (root / "bird" / "readme.md").write_text("x")
    with pytest.raises(SourceError, match="bird"):
        open_source(str(root))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(SourceError, match="empty"):
        open_source(str(tmp_path / "empty"))


def test_corrupt_and_truncated_images_raise_corrupt_image():
    good = _jpeg((1, 2, 3), size=(200, 150))
    with pytest.raises(CorruptImage, match="x.jpg"):
        prepare_image_bytes(good[: len(good) // 2], ".jpg", None, "x.jpg")
    with pytest.raises(CorruptImage):
        prepare_image_bytes(b"this is not an image", ".png", None, "y.png")
    assert prepare_image_bytes(good, ".jpg", None, "ok.jpg") == (good, "jpg")


def test_other_formats_are_reencoded_and_max_side_applies():
    out = io.BytesIO()
    Image.new("RGB", (300, 100), (9, 9, 9)).save(out, format="BMP")
    data, ext = prepare_image_bytes(out.getvalue(), ".bmp", None, "a.bmp")
    assert ext == "png" and Image.open(io.BytesIO(data)).size == (300, 100)
    data, ext = prepare_image_bytes(out.getvalue(), ".bmp", 60, "a.bmp")
    assert Image.open(io.BytesIO(data)).size == (60, 20)
