import io
import os
import pickle
import tarfile

import numpy as np
import pytest
from PIL import Image

from tests.common.sources import CIFAR_BATCHES, make_image_folder
from tests.common.sources import solid_jpeg as _jpeg
from tests.common.sources import write_cifar as _write_cifar
from tpustream.image.codec import CorruptImage, decode_ppm, encode_ppm, prepare_image_bytes
from tpustream.sources.dispatch import open_source
from tpustream.sources.types import SourceError


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


@pytest.mark.parametrize("protocol", [2, 5])
def test_crafted_cifar_pickle_is_rejected_without_running(tmp_path, protocol):
    marker = tmp_path / "pwned"
    directory = tmp_path / "cifar"
    _write_cifar(directory)
    with open(directory / "data_batch_1", "wb") as f:
        pickle.dump({b"data": _Evil(marker), b"labels": []}, f, protocol=protocol)
    with pytest.raises(SourceError, match="refusing to load"):
        open_source(f"cifar10:{directory}")
    assert not marker.exists()


def test_cifar10_missing_batches(tmp_path):
    with pytest.raises(SourceError, match="no data_batch"):
        open_source(f"cifar10:{tmp_path}")


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_batches_resaved_with_any_protocol(tmp_path, protocol):
    """Protocol 5 rebuilds arrays with numpy's _frombuffer (bytes -> array, nothing run): allowed."""
    _write_cifar(tmp_path / "cifar", protocol=protocol)
    source = open_source(f"cifar10:{tmp_path / 'cifar'}")
    assert len(source.items) == 120
    with open(tmp_path / "cifar" / "test_batch", "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    expected = batch[b"data"][0].reshape(3, 32, 32).transpose(1, 2, 0)
    assert np.array_equal(decode_ppm(source.load(source.items[100])[0]), expected)


@pytest.mark.parametrize(
    "present, missing",
    [
        (CIFAR_BATCHES[:5], "missing test_batch;"),
        (CIFAR_BATCHES[:2] + ["test_batch"], "missing data_batch_3, data_batch_4, data_batch_5;"),
    ],
)
def test_cifar10_partial_copy_is_an_error_naming_the_missing_files(tmp_path, present, missing):
    """A copy without test_batch would silently give a dataset with no val split; without some
    data_batch_N, one with a fraction of the training data."""
    _write_cifar(tmp_path / "cifar-10-batches-py", batches=present)
    with pytest.raises(SourceError, match=missing):
        open_source(f"cifar10:{tmp_path}")
    archive = tmp_path / "partial.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    with pytest.raises(SourceError, match=missing):
        open_source(f"cifar10:{archive}")


def test_cifar10_path_that_is_a_batch_file_or_missing(tmp_path):
    _write_cifar(tmp_path / "cifar")
    with pytest.raises(SourceError, match="data_batch_1 is a file, not a directory or archive"):
        open_source(f"cifar10:{tmp_path / 'cifar' / 'data_batch_1'}")
    with pytest.raises(SourceError, match="does not exist"):
        open_source(f"cifar10:{tmp_path / 'nowhere'}")


# --------------------------------------------------------------------------- ImageFolder


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


def test_image_folder_own_split_ignores_files_beside_the_split_folders(tmp_path):
    make_image_folder(tmp_path / "data" / "train")
    make_image_folder(tmp_path / "data" / "val", per_class=2)
    (tmp_path / "data" / "README.txt").write_text("where these photos come from")
    source = open_source(str(tmp_path / "data"))
    assert source.has_own_split and source.classes == ["cat", "dog"] and len(source.items) == 12
    assert source.ignored == ["README.txt"]


def test_image_folder_with_only_train_folder_has_no_own_split(tmp_path, caplog):
    """train/<class>/ alone: the classes come from train/, and the val split is drawn from them."""
    make_image_folder(tmp_path / "data" / "train", per_class=5)
    (tmp_path / "data" / "README.txt").write_text("x")
    os.makedirs(tmp_path / "data" / "val" / "cat")
    (tmp_path / "data" / "val" / "cat" / "notes.txt").write_text("no images in val/")
    with caplog.at_level("WARNING"):
        source = open_source(str(tmp_path / "data"))
    assert source.classes == ["cat", "dog"] and len(source.items) == 10
    assert not source.has_own_split and all(item.split is None for item in source.items)
    assert "no images in a val/, validation/ or test/ folder" in caplog.text
    data, ext = source.load(source.items[0])
    assert ext == "jpg" and data == (tmp_path / "data" / str(source.items[0].ref)).read_bytes()


def test_image_folder_empty_local_class_folder_is_an_error(tmp_path):
    """An empty local folder does not show up in a file listing; it is still a class with no images."""
    root = make_image_folder(tmp_path / "data")
    os.makedirs(root / "bird")
    os.makedirs(root / ".cache")  # hidden: not a class
    with pytest.raises(SourceError, match=r"class folder\(s\) bird contain no images.*remove the folder"):
        open_source(str(root))
    make_image_folder(tmp_path / "split" / "train")
    make_image_folder(tmp_path / "split" / "val", per_class=2)
    os.makedirs(tmp_path / "split" / "train" / "bird")
    with pytest.raises(SourceError, match=r"class folder\(s\) bird contain no images"):
        open_source(str(tmp_path / "split"))


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


def _png(array, mode=None):
    out = io.BytesIO()
    (Image.fromarray(array) if mode is None else Image.fromarray(array).convert(mode)).save(out, format="PNG")
    return out.getvalue()


def test_sixteen_bit_png_is_scaled_to_eight_bits_not_clipped_white():
    data = _png(np.full((6, 9), 30000, dtype=np.uint16))
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    out, ext = prepare_image_bytes(data, ".png", None, "deep.png")
    assert ext == "png"
    with Image.open(io.BytesIO(out)) as img:
        assert img.mode == "RGB" and img.size == (9, 6)
        assert set(np.asarray(img).ravel().tolist()) == {30000 >> 8}  # 117, not 255
    small, _ = prepare_image_bytes(data, ".png", 8, "deep.png")
    assert np.asarray(Image.open(io.BytesIO(small))).max() == 117


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "L"])
def test_eight_bit_png_modes_keep_their_bytes(mode):
    data = _png(np.full((4, 4, 3), 77, dtype=np.uint8), mode)
    assert prepare_image_bytes(data, ".png", None, "x.png") == (data, "png")


def test_file_uri_sources_are_their_local_paths(tmp_path):
    # issue 15: `--source file:///dir` was an "unknown source", `cifar10:file:///dir` "does not exist"
    root = make_image_folder(tmp_path / "data")
    assert open_source(f"file://{root}").items == open_source(str(root)).items
    _write_cifar(tmp_path / "cifar-10-batches-py")
    assert len(open_source(f"cifar10:file://{tmp_path}").items) == 120


def test_a_fifo_in_an_image_folder_is_skipped_not_waited_on(tmp_path):
    from tpustream.image.codec import UnreadableImage

    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / name / "0.png")
    os.mkfifo(tmp_path / "cat" / "1.png")  # nobody writes to it: a blocking open would never return
    source = open_source(str(tmp_path))
    fifo = next(item for item in source.items if str(item.ref) == "cat/1.png")
    with pytest.raises(UnreadableImage, match="is a FIFO, not a regular file"):
        source.load(fifo)
