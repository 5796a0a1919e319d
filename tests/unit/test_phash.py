"""tpustream/image/phash.py: our pHash equals imagehash.phash bit for bit on real photos and the bundled digits,
and the shard-writing path (a JPEG decoded to grey scaled down by libjpeg, resize and DCT as one linear map,
CIFAR-size PPMs a batch at a time) stays within a few bits of it."""

import io

import imagehash
import numpy as np
import pytest
import skimage.data
from PIL import Image
from sklearn.datasets import load_digits

from tpustream.image.codec import encode_ppm
from tpustream.image.phash import (
    HASH_DRAFT_SIZE,
    PPM32_HEADER,
    Ppm32Hasher,
    hash_bits,
    hash_grey_pixels,
    hash_hex,
    hash_hex_batch,
    hash_input_of_image,
    hash_lows_image,
    hash_lows_images,
    hash_lows_ppm32,
    perceptual_hash,
    perceptual_hash_bytes,
)
from tpustream.sources.builtin import SYNTHETIC_IMAGENET_PHOTOS, synthetic_cifar_image

PHOTOS = [*SYNTHETIC_IMAGENET_PHOTOS, "cat", "coins", "horse", "page", "text", "clock", "logo", "colorwheel"]


def _photos() -> list[Image.Image]:
    images = []
    for name in PHOTOS:
        pixels = getattr(skimage.data, name)()
        if pixels.dtype != np.uint8:  # horse is boolean
            pixels = (pixels > 0).astype(np.uint8) * 255 if pixels.dtype == bool else pixels.astype(np.uint8)
        images.append(Image.fromarray(pixels))
    return images


def _digits(count: int) -> list[Image.Image]:
    grey = np.clip(load_digits().images[:count] * 16, 0, 255).astype(np.uint8)
    return [Image.fromarray(pixels) for pixels in grey]


def _photo_grey() -> np.ndarray:
    return np.asarray(Image.fromarray(skimage.data.camera()).resize((64, 128)))


def _imagehash(image: Image.Image) -> int:
    return int(str(imagehash.phash(image)), 16)


def test_equals_imagehash_bit_for_bit_on_photos_digits_and_small_images():
    digits = _digits(200)
    images = [
        *_photos(),
        *digits,  # 8x8 grey, upscaled by the hash's own Lanczos
        *(digit.resize((32, 32), Image.Resampling.NEAREST) for digit in digits[:100]),
        *(Image.fromarray(synthetic_cifar_image(i, i % 10)) for i in range(100)),
        Image.new("RGB", (40, 30), (128, 128, 128)),  # flat: every AC coefficient exactly 0
        Image.fromarray(np.hstack([_photo_grey(), _photo_grey()[:, ::-1]])),  # mirrored: odd ones 0
    ]
    mismatches = [i for i, image in enumerate(images) if perceptual_hash(image) != _imagehash(image)]
    assert mismatches == []


def test_bytes_path_stays_within_a_few_bits_of_the_full_decode():
    """A JPEG is hashed decoded to grey scaled down by libjpeg (to 63x47 and 28x21 here): on the photos at
    500x375 and 224x168 it equals imagehash on the full RGB decode for most, and differs by at most 8 bits
    (measured: 19 of 36 equal, 2-4 bits for most others, 8 for two fine textures). The planted-copy ROC is
    measured on this path, PNG copies of JPEGs included."""
    distances = []
    for photo in _photos():
        for side in (500, 224):
            rgb = photo.convert("RGB").resize((side, side * 3 // 4))
            out = io.BytesIO()
            rgb.save(out, format="JPEG", quality=90)
            full = Image.open(io.BytesIO(out.getvalue())).convert("RGB")
            distances.append((perceptual_hash_bytes(out.getvalue()) ^ _imagehash(full)).bit_count())
    assert sorted(distances)[len(distances) // 2] == 0, distances
    assert max(distances) <= 8, distances


def test_png_bytes_hash_as_the_decoded_image_and_cifar_ppms_within_a_few_bits():
    """A PNG is decoded in full and hashed as imagehash does at 32 px; a 32x32 PPM goes through the batch path
    (unrounded luma, float32): measured 239 of 300 equal to imagehash, none more than 4 bits apart."""
    image = Image.fromarray(synthetic_cifar_image(3, 3))
    out = io.BytesIO()
    image.save(out, format="PNG")
    assert perceptual_hash_bytes(out.getvalue()) == _imagehash(image)
    distances = []
    for i in range(300):
        pixels = synthetic_cifar_image(i, i % 10)
        distances.append(
            (perceptual_hash_bytes(encode_ppm(pixels)) ^ _imagehash(Image.fromarray(pixels))).bit_count()
        )
    assert sum(d == 0 for d in distances) >= 0.7 * len(distances), distances
    assert max(distances) <= 4, distances


def test_a_shard_of_ppms_hashes_as_one_ppm_at_a_time():
    """hash_lows_ppm32 takes them 8 at a time: 100 PPMs (chunks of 8 and a last of 4, whose 4 spare slots hold
    the chunk before's pixels) hash as each alone, and a flat image (every AC coefficient exactly 0, float32
    noise rounded away) hashes as imagehash's."""
    ppms = [encode_ppm(synthetic_cifar_image(i, i % 10)) for i in range(99)]
    ppms.append(encode_ppm(np.full((32, 32, 3), 77, dtype=np.uint8)))
    together = hash_bits(hash_lows_ppm32(ppms))
    alone = [perceptual_hash_bytes(ppm) for ppm in ppms]
    assert [int(h) for h in together] == alone
    assert alone[-1] == _imagehash(Image.new("RGB", (32, 32), (77, 77, 77)))
    assert hash_hex_batch(together) == [hash_hex(h) for h in alone]


def test_the_writers_batches_hash_each_ppm_as_the_per_image_function_does():
    """Shard writing hashes a CIFAR-size shard's PPMs 256 at a time in reused buffers (Ppm32Hasher), float32:
    610 PPMs (photos-like, noise, flat; batches of 256, 256 and 98, chunks of 8 and a last of 2) get, bit for
    bit, each one's perceptual_hash_bytes and the batch function's hash, so a faster batch cannot change a
    stored bit unnoticed; the flat ones equal imagehash's."""
    rng = np.random.default_rng(45)
    pixels = [synthetic_cifar_image(i, i % 10) for i in range(300)]
    pixels += [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(300)]
    pixels += [np.full((32, 32, 3), 25 * level, dtype=np.uint8) for level in range(10)]
    ppms = [encode_ppm(image) for image in pixels]
    hasher = Ppm32Hasher()
    for ppm in ppms:
        hasher.add(ppm)
    batched = [int(h) for h in hasher.hashes()]
    assert batched == [perceptual_hash_bytes(ppm) for ppm in ppms]
    assert batched == [int(h) for h in hash_bits(hash_lows_ppm32(ppms))]
    flat = [_imagehash(Image.fromarray(image)) for image in pixels[-10:]]
    assert batched[-10:] == flat
    assert len(set(batched[:600])) == 600  # distinct images, distinct hashes
    assert Ppm32Hasher().hashes().tolist() == []


def test_the_writers_batches_refuse_a_ppm_that_is_not_32x32():
    hasher = Ppm32Hasher()
    hasher.add(b"P6\n32 31\n255\n" + bytes(32 * 32 * 3 - 1) + b"x")  # same length, other header
    with pytest.raises(ValueError, match="takes 32x32 PPMs"):
        hasher.hashes()
    with pytest.raises(ValueError, match="takes 32x32 PPMs of 3085 bytes, got 23 bytes"):
        Ppm32Hasher().add(PPM32_HEADER + bytes(10))


def test_the_writers_drafts_hash_together_as_each_alone():
    """Shard writing keeps a JPEG's small grey draft and hashes a shard's drafts together, by size
    (hash_lows_images): the coefficients equal hash_lows_image's of each bit for bit, whatever the mix of
    sizes and modes; a draft above DEFERRED_HASH_PIXELS is hashed at once rather than held."""
    images = []
    for i, photo in enumerate(_photos()):
        for size in ((28, 28), (63, 47), (28, 21), (8, 8)):
            images.append(photo.convert("L" if i % 3 else "RGB").resize(size))
    together = hash_lows_images(images)
    assert np.array_equal(together, np.stack([hash_lows_image(image) for image in images]))
    assert hash_lows_images([]).shape == (0, 64)
    small = _photos()[0].convert("L").resize((63, 47))
    assert hash_input_of_image(small) is small
    large = _photos()[0].convert("L").resize((125, 94))
    assert np.array_equal(hash_input_of_image(large), hash_lows_image(large))  # type: ignore[arg-type]
    # a small colour image (a thumbnail) is held too, as the grey image hash_lows_image takes of it
    colour = _photos()[1].convert("RGB").resize((32, 32))
    held = hash_input_of_image(colour)
    assert isinstance(held, Image.Image) and held.mode == "L"
    assert np.array_equal(hash_lows_images([held]), hash_lows_image(colour)[None])
    wide = colour.resize((80, 60))  # above DEFERRED_HASH_PIXELS: its coefficients at once
    assert np.array_equal(hash_input_of_image(wide), hash_lows_image(wide))  # type: ignore[arg-type]


def test_the_writers_grey_pixels_hash_as_their_image():
    """Shard writing hands a thumbnail's grey pixels (the uint8 array its window hashes take) to
    hash_lows_images instead of its image: the same coefficients bit for bit, mixed with images of the same
    and other sizes; anything but HxW uint8 pixels is refused."""
    images = [photo.convert("L").resize(size) for photo in _photos() for size in ((32, 32), (28, 21))]
    arrays = [np.asarray(image) for image in images]
    mixed = [array if i % 2 else image for i, (image, array) in enumerate(zip(images, arrays, strict=True))]
    assert np.array_equal(hash_lows_images(mixed), hash_lows_images(images))
    assert np.array_equal(hash_lows_images(arrays), np.stack([hash_lows_image(image) for image in images]))
    with pytest.raises(ValueError, match="HxW uint8 grey pixels"):
        hash_lows_images([arrays[0].astype(np.float32)])


def test_the_linear_resize_is_pillows_lanczos():
    """hash_lows_image (Pillow's Lanczos weights and the DCT as one float map, no uint8 step) gives imagehash's
    bits on the photos at sizes it reduces, enlarges and keeps (measured: 74 of 90 equal, the others 2 bits
    apart, 4 for two 8 px images enlarged 4x, where imagehash's uint8 rounding weighs most)."""
    distances = []
    for photo in _photos():
        for size in ((500, 375), (63, 47), (28, 28), (32, 32), (8, 8)):
            image = photo.convert("RGB").resize(size)
            distances.append(
                (int(hash_bits(hash_lows_image(image)[None])[0]) ^ _imagehash(image)).bit_count()
            )
            if size == (32, 32):
                assert distances[-1] == 0  # no resize: imagehash's own arithmetic
    assert max(distances) <= 4, distances
    assert sum(d == 0 for d in distances) >= 0.75 * len(distances), distances


def test_pillows_resize_to_the_same_size_is_a_copy():
    """Why a 32x32 image needs no resize before the DCT (imagehash resizes it to 32x32 all the same)."""
    image = Image.fromarray(synthetic_cifar_image(5, 5)).convert("L")
    assert image.resize((32, 32), Image.Resampling.LANCZOS).tobytes() == image.tobytes()


def test_bad_input_is_refused_with_its_name():
    with pytest.raises(ValueError, match="cat.jpg: cannot decode the image to hash it"):
        perceptual_hash_bytes(b"not an image", name="cat.jpg")
    with pytest.raises(ValueError, match="32x32 grey image, got shape"):
        hash_grey_pixels(np.zeros((8, 8), dtype=np.uint8))
    with pytest.raises(ValueError, match="takes 32x32 PPMs"):
        hash_lows_ppm32([encode_ppm(np.zeros((32, 31, 3), dtype=np.uint8))])


def test_a_writer_hashing_its_own_draft_decode_gets_the_bytes_hash():
    """Shard writing opens a JPEG, drafts it to grey at HASH_DRAFT_SIZE and hashes the loaded image: the same
    hash as perceptual_hash_bytes, at sizes where libjpeg reduces by 8 (500 and 224 px), 4 (100) and not at
    all (32)."""
    for photo in _photos()[:6]:
        for size, side in (((500, 375), 47), ((224, 224), 28), ((100, 100), 25), ((32, 32), 32)):
            out = io.BytesIO()
            photo.convert("RGB").resize(size).save(out, format="JPEG", quality=90)
            with Image.open(io.BytesIO(out.getvalue())) as img:
                img.draft("L", HASH_DRAFT_SIZE)
                img.load()
                assert img.mode == "L" and min(img.size) == side
                assert int(hash_bits(hash_lows_image(img)[None])[0]) == perceptual_hash_bytes(out.getvalue())
