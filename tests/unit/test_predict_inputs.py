"""What ``tpustream predict`` reads (tpustream/serve/predict/inputs.py): a file that is not an image is counted
``not-an-image`` whether it is named on the command line or found in a folder (issue 42: a named .txt was
decoded and counted ``undecodable``); a named image saved without an extension is still read."""

import io

import pytest
from PIL import Image

from tpustream.serve.predict.config import PredictError
from tpustream.serve.predict.inputs import NOT_AN_IMAGE, Skipped, iter_items


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize("read", [True, False])
def test_a_non_image_is_not_an_image_named_or_listed(tmp_path, read):
    folder = tmp_path / "images"
    (folder / "cat").mkdir(parents=True)
    (folder / "cat" / "a.png").write_bytes(_png())
    (folder / "notes.txt").write_text("not an image")
    (folder / "README").write_text("not an image either")
    listed, named = Skipped(), Skipped()
    in_folder = [item.name for item in iter_items([str(folder)], listed, read=read)]
    by_name = [
        item.name
        for item in iter_items(
            [str(folder / "notes.txt"), str(folder / "README"), str(folder / "cat" / "a.png")],
            named,
            read=read,
        )
    ]
    assert in_folder == by_name == [str(folder / "cat" / "a.png")]
    assert listed.counts == named.counts == {NOT_AN_IMAGE: 2}
    assert sorted(named.examples[NOT_AN_IMAGE]) == [str(folder / "README"), str(folder / "notes.txt")]


def test_a_named_image_without_an_extension_is_read_by_its_signature(tmp_path):
    photo = tmp_path / "download"
    photo.write_bytes(_png())
    skipped = Skipped()
    (item,) = iter_items([str(photo)], skipped)
    assert item.name == str(photo) and item.data == photo.read_bytes() and skipped.counts == {}


def test_a_folder_with_no_image_is_still_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(PredictError, match=r"holds no images .* \(1 other files\)"):
        list(iter_items([str(tmp_path)]))
