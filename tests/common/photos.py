"""Folders of scikit-image's photos with planted near-copies across splits, for the data check's near-leak tests
(tests/unit/test_dataset_check_near.py) and the run report's near-duplicates section
(tests/unit/test_report_near_leaks.py)."""

import io
import shutil

import skimage.data
from PIL import Image

TRAIN = ["astronaut", "coffee", "chelsea", "rocket", "camera", "moon", "brick", "retina"]  # 4 per class
HELD_OUT = ["hubble_deep_field", "coins", "page", "clock"]  # distinct photos: no pair with train


def photo(name: str, side: int = 240) -> Image.Image:
    pixels = getattr(skimage.data, name)()
    image = Image.fromarray(pixels[..., :3] if pixels.ndim == 3 else pixels).convert("RGB")
    return image.resize((side, side * 3 // 4))


def jpeg_bytes(image: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def photo_folder(root):
    """train/ a|b / 8 photos; val/ and test/ distinct photos plus planted copies of train photos: a JPEG
    re-save at q70 (val), a 90% resize (val), a re-save at q70 of a 110% resize (test), a byte copy (test)."""
    for i, name in enumerate(TRAIN):
        folder = root / "train" / "ab"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.jpg").write_bytes(jpeg_bytes(photo(name)))
    for i, name in enumerate(HELD_OUT):
        folder = root / ("val" if i < 2 else "test") / "ab"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.jpg").write_bytes(jpeg_bytes(photo(name)))
    coffee = Image.open(root / "train" / "b" / "coffee.jpg")
    (root / "val" / "b" / "coffee-resaved.jpg").write_bytes(jpeg_bytes(coffee, quality=70))
    rocket = Image.open(root / "train" / "b" / "rocket.jpg")
    rocket.resize((216, 162), Image.Resampling.BILINEAR).save(root / "val" / "b" / "rocket-small.png")
    camera = Image.open(root / "train" / "a" / "camera.jpg")
    (root / "test" / "a" / "camera-bigger.jpg").write_bytes(
        jpeg_bytes(camera.resize((264, 198), Image.Resampling.BICUBIC), quality=70)
    )
    shutil.copy(root / "train" / "b" / "moon.jpg", root / "test" / "b" / "moon-copy.jpg")
    return root
