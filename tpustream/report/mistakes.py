"""The run report's mistakes: the most confident wrong predictions per class, with a thumbnail of each image.

Evaluate's per-sample scores name every val (or test) sample by its key in the shards, its source file, its
true class and its top predictions. A mistake is a sample whose top prediction is not its class; the gallery
shows, for each true class, its most confident mistakes (the ones a threshold would not catch), bounded in
count per class and in total, so the page stays small whatever the dataset. Thumbnails come from the shards
(what the model was evaluated on; the source file may be gone or private), read only from the shards that
hold a shown sample (the sample index says which), decoded under the pixel budget, downsized and re-encoded
as small JPEGs inlined as data URIs: the page stays one self-contained file (its CSP allows ``data:`` only).
No torch.
"""

from __future__ import annotations

import base64
import io
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tpustream.artifacts import Manifest
from tpustream.image.codec import DEFAULT_MAX_PIXELS, PIL_FORMATS, decode_ppm, image_member, pixel_budget
from tpustream.storage import io as storage

__all__ = ["MISTAKES_PER_CLASS", "MISTAKES_TOTAL", "THUMBNAIL_SIDE", "Mistake", "pick_mistakes", "thumbnails"]

log = logging.getLogger(__name__)

MISTAKES_PER_CLASS = 4  # per true class, the most confident first
MISTAKES_TOTAL = 48  # in all: with THUMBNAIL_SIDE, the section stays within ~200 KB
THUMBNAIL_SIDE = 96  # the longer side of a thumbnail, in pixels
THUMBNAIL_QUALITY = 70


@dataclass(frozen=True, kw_only=True)
class Mistake:
    """One wrongly classified sample: what it is, what the model said and how sure it was."""

    key: str  # the sample's key in the shards
    source: str  # the file it came from (the sample index's ``source``), "" when unknown
    true_class: str
    predicted_class: str
    confidence: float  # the top prediction's probability


def pick_mistakes(
    mistakes: Iterable[Mistake], *, per_class: int = MISTAKES_PER_CLASS, limit: int = MISTAKES_TOTAL
) -> list[Mistake]:
    """The most confident mistakes of each true class (at most ``per_class`` each), classes taken in turn
    (each class's surest first, then each class's second, ...) until ``limit``: no class fills the page
    while another is left out. Ties are broken by key, so the choice is the same on every run."""
    by_class: dict[str, list[Mistake]] = defaultdict(list)
    for mistake in mistakes:
        by_class[mistake.true_class].append(mistake)
    ranked = {
        name: sorted(rows, key=lambda m: (-m.confidence, m.key))[:per_class]
        for name, rows in sorted(by_class.items())
    }
    picked: list[Mistake] = []
    for rank in range(per_class):
        for name in ranked:
            if rank < len(ranked[name]) and len(picked) < limit:
                picked.append(ranked[name][rank])
    return picked


def thumbnails(
    dataset: str, manifest: Manifest, split: str, keys: Iterable[str], *, side: int = THUMBNAIL_SIDE
) -> dict[str, str]:
    """``{key: "data:image/jpeg;base64,..."}`` for the samples ``keys`` of ``split``, read from its shards.
    A sample whose image cannot be read or decoded is left out (the gallery shows it without a picture) and
    logged; nothing here fails the report."""
    from tpustream.dataset import tario
    from tpustream.dataset.manifest import ShardError, has_sample_index, iter_shard_indexes

    wanted = set(keys)
    found = manifest.split(split)
    if not wanted or found is None:
        return {}
    shards = list(found.shards)
    if has_sample_index(manifest):  # open only the shards whose sample index lists a wanted sample
        try:
            holding = {
                shard.path
                for shard, entries in iter_shard_indexes(dataset, manifest, split)
                if any(entry.key in wanted for entry in entries)
            }
            shards = [shard for shard in shards if shard.path in holding]
        except (ShardError, storage.StorageError) as exc:
            log.warning("report: %s; every %s shard is searched for the thumbnails", exc, split)
    out: dict[str, str] = {}
    for shard in shards:
        uri = storage.join(dataset, shard.path)
        try:
            with storage.open_read(uri) as stream:
                for key, fields in tario.iter_tar_samples(stream):
                    if key in wanted and key not in out:
                        thumbnail = _thumbnail(fields, side)
                        if thumbnail is not None:
                            out[key] = thumbnail
                        else:
                            log.info("report: no thumbnail for %s in %s (not a decodable image)", key, uri)
        except (storage.StorageError, tario.TarFormatError) as exc:
            log.warning("report: thumbnails from %s left out: %s", uri, exc)
        if len(out) == len(wanted):
            break
    return out


def _thumbnail(fields: dict[str, bytes], side: int) -> str | None:
    from PIL import Image

    member = image_member(fields)
    if member is None:
        return None
    data = fields[member]
    try:
        with pixel_budget(DEFAULT_MAX_PIXELS):
            if member == "ppm":
                image = Image.fromarray(decode_ppm(data))
            else:
                # only the Pillow plugin of the member's format reads it (image.codec.PIL_FORMATS' rule)
                image = Image.open(io.BytesIO(data), formats=[PIL_FORMATS[member]])
                image.draft("RGB", (side, side))  # a JPEG decodes at a reduced scale
                image = image.convert("RGB")
            image.thumbnail((side, side), Image.Resampling.LANCZOS)
            if max(image.size) < side:  # an 8 px digit: scale up so a person can see it, pixels kept sharp
                scale = side // max(image.size)
                image = image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)
    except Exception as exc:  # noqa: BLE001 (any decoder's error: this sample is shown without a picture)
        log.debug("thumbnail: %s", exc)
        return None
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=THUMBNAIL_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
