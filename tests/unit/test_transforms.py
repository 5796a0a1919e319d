import io
import random

import numpy as np
import pytest
from PIL import Image

from tpustream.image.codec import encode_ppm
from tpustream.image.transforms import (
    Augment,
    Prepared,
    center_crop_box,
    decode_image,
    normalize,
    prepare_image,
    random_resized_crop_box,
    render,
    render_batch,
)
from tpustream.sources.builtin import synthetic_cifar_image, synthetic_imagenet_jpeg


def _pillow(image, box, size, flip):
    out = np.asarray(Image.fromarray(image).resize((size, size), Image.BILINEAR, box=box))
    return out[:, ::-1] if flip else out


def test_batched_upscale_matches_pillow():
    rng = random.Random(0)
    items = []
    for i in range(64):
        image = synthetic_cifar_image(i, i % 10)
        box = random_resized_crop_box(32, 32, rng, (0.35, 1.0), (3 / 4, 4 / 3))
        items.append(Prepared(image, tuple(map(float, box)), flip=bool(i % 2)))
    batched = np.empty((64, 3, 32, 32), np.uint8)
    render_batch(items, 32, batched)
    batched = batched.transpose(0, 2, 3, 1)  # the batch is CHW; compare in Pillow's HWC
    for i, item in enumerate(items):
        diff = np.abs(batched[i].astype(int) - _pillow(item.image, item.box, 32, item.flip).astype(int))
        assert diff.mean() < 1.0 and np.percentile(diff, 99) <= 6, (i, diff.mean(), diff.max())


def test_render_batch_mixed_sizes_matches_one_by_one():
    """Small same-shaped images (batched resample) interleaved with large ones (one by one): every
    slot gets its own image, whichever path rendered it."""
    rng = random.Random(3)
    large = np.asarray(Image.open(io.BytesIO(synthetic_imagenet_jpeg(2, 2))).convert("RGB"))
    items = []
    for i in range(12):
        image = large if i % 3 == 1 else synthetic_cifar_image(i, i % 10)
        height, width = image.shape[:2]
        box = random_resized_crop_box(width, height, rng, (0.35, 1.0), (3 / 4, 4 / 3))
        items.append(Prepared(image, tuple(map(float, box)), flip=bool(i % 2)))
    batched = np.full((12, 3, 32, 32), 7, np.uint8)
    render_batch(items, 32, batched)
    for i, item in enumerate(items):
        alone = np.empty((3, 32, 32), np.uint8)
        render(item, 32, alone)
        diff = np.abs(batched[i].astype(int) - alone.astype(int))
        assert diff.mean() < 1.0, (i, diff.mean())
        assert batched[i].std() > 5  # an image, not the fill value


def test_large_image_render_matches_pillow():
    rng = random.Random(2)
    image = np.asarray(Image.open(io.BytesIO(synthetic_imagenet_jpeg(1, 1))).convert("RGB"))
    for flip in (False, True):
        box = tuple(map(float, random_resized_crop_box(500, 375, rng, (0.08, 1.0), (3 / 4, 4 / 3))))
        ours = np.empty((3, 224, 224), np.uint8)
        render(Prepared(image, box, flip), 224, ours)
        ours = ours.transpose(1, 2, 0)
        assert np.abs(ours.astype(int) - _pillow(image, box, 224, flip).astype(int)).mean() < 0.5


def test_crop_boxes_follow_torchvision_bounds():
    rng = random.Random(1)
    for _ in range(500):
        left, top, right, bottom = random_resized_crop_box(500, 375, rng, (0.08, 1.0), (3 / 4, 4 / 3))
        w, h = right - left, bottom - top
        assert 0 <= left < right <= 500 and 0 <= top < bottom <= 375
        assert 0.08 * 500 * 375 * 0.9 <= w * h <= 500 * 375
    assert center_crop_box(500, 375, 224) == (86, 23, 414, 351)  # 375 * 0.875 = 328
    assert center_crop_box(8, 8, 32) == (0, 0, 8, 8)  # small images are not cropped


def test_jpeg_reduced_decode_is_close_to_full_decode():
    data = synthetic_imagenet_jpeg(3, 3)
    augment = Augment(output_size=64, train=False)
    reduced = decode_image(data, "jpg", augment, random.Random(0))
    full = np.asarray(
        Image.open(io.BytesIO(data)).convert("RGB").crop((86, 23, 414, 351)).resize((64, 64), Image.BILINEAR)
    )
    prepared = prepare_image(data, "jpg", augment, random.Random(0))
    assert prepared.image.shape[1] < 500  # decoded at a reduced DCT scale
    assert np.abs(reduced.astype(int) - full.astype(int)).mean() < 4


def test_ppm_and_png_decode_to_same_pixels():
    image = synthetic_cifar_image(5, 5)
    png = io.BytesIO()
    Image.fromarray(image).save(png, format="PNG")
    augment = Augment(output_size=32, train=False)
    a = decode_image(encode_ppm(image), "ppm", augment, random.Random(0))
    b = decode_image(png.getvalue(), "png", augment, random.Random(0))
    assert np.array_equal(a, b) and np.array_equal(a, image)


def test_sixteen_bit_png_decodes_to_its_grey_level_not_white():
    """A 16-bit PNG in a shard written before they were re-encoded at write time."""
    png = io.BytesIO()
    Image.fromarray(np.full((32, 32), 30000, dtype=np.uint16)).save(png, format="PNG")
    augment = Augment(output_size=32, train=False)
    image = decode_image(png.getvalue(), "png", augment, random.Random(0))
    assert image.shape == (32, 32, 3) and set(image.ravel().tolist()) == {30000 >> 8}


def test_undecodable_raises():
    with pytest.raises(Exception):  # noqa: B017 - any decoder error; the loader counts them all
        decode_image(b"\xff\xd8garbage", "jpg", Augment(output_size=32, train=True), random.Random(0))


def test_normalize_on_device():
    import torch

    batch = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    out = normalize(batch)
    assert out.dtype == torch.float32
    assert torch.allclose(
        out[0, :, 0, 0], torch.tensor([(1 - 0.485) / 0.229, (1 - 0.456) / 0.224, (1 - 0.406) / 0.225])
    )
