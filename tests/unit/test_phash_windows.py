"""tpustream/image/phash_windows.py: a shard's thumbnails hashed together (``window_hashes_batch``, what shard
writing stores through ``WindowHasher``) give the same window hashes as one image at a time, bit for bit, on
the bundled digits, random images of every thumbnail shape and CIFAR-size PPMs, mixed in one batch; each
split stores its role's 9 windows; a window hash stays within the data check's tolerance of the float64 maps."""

import contextlib
import io

import numpy as np
import pytest
from PIL import Image

from tpustream.bench.datacheck import _digit_originals
from tpustream.image.codec import encode_ppm, prepare_image_bytes
from tpustream.image.phash import _DCT, _LUMA, hash_bits, perceptual_hash_bytes
from tpustream.image.phash_windows import (
    WINDOWS,
    WindowHasher,
    _axis_map_float64,
    split_window_hex,
    window_hashes_batch,
    window_hashes_bytes,
    window_hashes_grey,
    window_hashes_hex,
    window_hex_batch,
    window_role,
)
from tpustream.sources.builtin import synthetic_cifar_image

ROLES = {"base": slice(0, WINDOWS), "query": slice(WINDOWS, 2 * WINDOWS)}


def _png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def digits():
    return _digit_originals()[0]


@pytest.mark.parametrize("role", ["base", "query"])
def test_a_batch_equals_one_image_at_a_time_on_the_digits_and_cifar_ppms(digits, role):
    ppms = [encode_ppm(synthetic_cifar_image(i, i % 10)) for i in range(300)]
    for images in (digits, ppms):
        batch = window_hashes_batch(images, role)
        one_by_one = np.stack([window_hashes_bytes(image)[ROLES[role]] for image in images])
        assert batch.shape == (len(images), WINDOWS)
        assert np.array_equal(batch, one_by_one)


def test_a_mixed_batch_of_every_thumbnail_shape_equals_each_image_alone(digits):
    """PPMs, PNG bytes and grey arrays of sides 32 to 64 (not square too), in one batch: grouped by size,
    put back in order."""
    rng = np.random.default_rng(0)
    greys = [
        rng.integers(0, 256, (h, w), dtype=np.uint8) for h, w in ((32, 32), (64, 40), (47, 33), (64, 64))
    ]
    greys += [np.asarray(Image.open(io.BytesIO(d))) for d in digits[:5]]
    images: list[bytes | np.ndarray] = []
    expected = []
    for i, grey in enumerate(greys):
        rgb = np.repeat(grey[:, :, None], 3, axis=2) if grey.shape == (32, 32) else None
        if rgb is not None and i % 2:
            images.append(encode_ppm(rgb))
            expected.append(window_hashes_bytes(encode_ppm(rgb)))
        elif i % 3 == 0:
            images.append(_png(grey))
            expected.append(window_hashes_bytes(_png(grey)))
        else:
            images.append(grey)
            expected.append(window_hashes_grey(grey))
    for role, part in ROLES.items():
        assert np.array_equal(window_hashes_batch(images, role), np.stack([e[part] for e in expected]))
        text = window_hex_batch(images, role)
        assert all(len(t) == WINDOWS * 16 for t in text)
        assert all(np.array_equal(split_window_hex(t), e[part]) for t, e in zip(text, expected, strict=True))
    assert window_hashes_hex(images[0], "base") == window_hex_batch(images[:1], "base")[0]


def test_the_window_hasher_keeps_the_order_and_none_for_larger_images(digits):
    with contextlib.closing(WindowHasher("query")) as hasher:
        added = []
        for i in range(600):  # more than one of its batches
            image = digits[i] if i % 7 else None
            hasher.add(image, f"digit{i}")
            added.append(image)
        got = hasher.hex()
    assert len(got) == 600 and [g is None for g in got] == [a is None for a in added]
    for text, image in zip(got[:50], added[:50], strict=True):
        if image is not None:
            assert np.array_equal(split_window_hex(text or ""), window_hashes_bytes(image)[WINDOWS:])


def test_each_split_stores_its_role():
    assert window_role("train") == "base"
    assert window_role("val") == window_role("test") == "query"


def test_float32_stays_within_the_check_s_tolerance_of_the_float64_maps(digits):
    """The float64 maps and hash_bits (the previous path) give the same digits' windows but for a few bits:
    measured 12 of the first 600 digits with any of their 18 hashes moved, by 1 bit."""
    moved, worst = 0, 0
    for data in digits[:600]:
        grey = np.asarray(Image.open(io.BytesIO(data)), dtype=np.float64)
        reference = []
        for role in ("base", "query"):
            rows = _axis_map_float64(32, role)
            lows = (rows @ grey @ rows.T).reshape(3, 8, 3, 8).transpose(0, 2, 1, 3).reshape(9, 64)
            reference.append(hash_bits(lows))
        ours = window_hashes_bytes(data)
        bits = [int(a ^ b).bit_count() for a, b in zip(np.concatenate(reference), ours, strict=True)]
        moved += any(bits)
        worst = max(worst, *bits)
    assert moved <= 30 and worst <= 2


def test_a_ppms_hash_and_windows_are_the_float64_maps_of_its_luma():
    """A 32x32 PPM's pHash and windows come from one product along the height for 8 images (the DCT's rows and
    the windows' stacked) and one along the width for each: against each image's float64 maps of its luma
    (Pillow's weights unrounded), the same bits but where float32 sums sit at the median (measured: 12 of 300
    synthetic CIFAR images with any of their 19 hashes moved, by 1 bit). A transposed or misplaced block would
    move about half of each hash's bits."""
    moved, worst = 0, 0
    for i in range(300):
        rgb = synthetic_cifar_image(i, i % 10)
        grey = rgb.astype(np.float64) @ _LUMA
        reference = [hash_bits((_DCT @ grey @ _DCT.T).reshape(1, 64))]
        for role in ("base", "query"):
            rows = _axis_map_float64(32, role)
            lows = (rows @ grey @ rows.T).reshape(3, 8, 3, 8).transpose(0, 2, 1, 3).reshape(9, 64)
            reference.append(hash_bits(lows))
        ppm = encode_ppm(rgb)
        ours = [perceptual_hash_bytes(ppm), *window_hashes_bytes(ppm)]
        bits = [(int(a) ^ int(b)).bit_count() for a, b in zip(np.concatenate(reference), ours, strict=True)]
        moved += any(bits)
        worst = max(worst, *bits)
    assert moved <= 30 and worst <= 2


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="photo.png: window hashes take a grey image of 32 to 64 px"):
        window_hashes_batch([np.zeros((100, 100), np.uint8)], "base", ["photo.png"])
    with pytest.raises(ValueError, match="broken.png: cannot decode"):
        window_hashes_batch([b"not an image"], "query", ["broken.png"])
    with pytest.raises(ValueError, match="window role 'both'"):
        window_hashes_batch([], "both")
    with pytest.raises(ValueError, match="9 x 16 hex digits, got 288"):
        split_window_hex("0" * 288)


@pytest.mark.parametrize(("split", "checked"), [("train", False), ("test", False), ("train", True)])
def test_shard_writing_stores_each_thumbnails_windows_as_the_per_image_function(
    tmp_path, digits, split, checked
):
    """A shard of 32x32 PPMs (hashed with their pHash, from the same grey pixels: phash.Ppm32Hasher), 32x32
    PNGs, grey and colour, and a 40x48 PNG (WindowHasher's thread) and a 100 px PNG (none), mixed, over more
    than one of the PPM hasher's batches: each sample's stored windows are window_hashes_hex of its bytes in
    its split's role, its pHash perceptual_hash_bytes', in the shard's order. ``checked``: the source checks
    each image as an ImageFolder does (codec.prepare_image_bytes), so that a thumbnail's pHash and windows are
    taken from the grey pixels of that check's decode, not from its bytes again."""
    from tpustream.dataset.manifest import SampleIndexEntry, index_path
    from tpustream.dataset.plan import ShardSpec
    from tpustream.dataset.shard_writer import write_shard
    from tpustream.image.phash import perceptual_hash_bytes
    from tpustream.sources.types import Item, Source

    rng = np.random.default_rng(7)
    images: list[bytes] = []
    for i in range(600):
        if i % 9 == 4:
            images.append(digits[i])  # a 32x32 grey PNG
        elif i % 9 == 7:
            images.append(_png(synthetic_cifar_image(i, i % 10)))  # a 32x32 colour PNG
        elif i == 100:
            images.append(_png(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)))
        elif i == 200:
            images.append(_png(rng.integers(0, 256, (100, 100, 3), dtype=np.uint8)))
        else:
            images.append(encode_ppm(synthetic_cifar_image(i, i % 10)))

    def load(item: Item, max_side: int | None) -> tuple[bytes, str]:
        data = images[int(item.ref)]
        ext = "png" if data[:1] == b"\x89" else "ppm"
        return prepare_image_bytes(data, ext, max_side, str(item.ref)) if checked else (data, ext)

    source = Source("test:mixed", "", ["a", "b"], [Item(i, i % 2) for i in range(len(images))], load)
    keys = tuple(f"{i:06d}" for i in range(len(images)))
    spec = ShardSpec(split, 0, keys, tuple(range(len(images))), "fingerprint")
    record = write_shard(source, spec, str(tmp_path), max_side=None, strict=True)
    lines = (tmp_path / index_path(spec.path)).read_text().splitlines()
    entries = [SampleIndexEntry.from_json_line(line) for line in lines]
    assert record.num_samples == len(entries) == len(images)
    role = window_role(split)
    for i, (entry, data) in enumerate(zip(entries, images, strict=True)):
        assert entry.key == keys[i] and entry.phash == f"{perceptual_hash_bytes(data):016x}", i
        expected = None if i == 200 else window_hashes_hex(data, role)
        assert entry.phash_windows == expected, i
