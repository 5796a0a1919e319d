"""Unreadable checkpoints and model weights are one line: the file, why, and what to do (issue 15, Why 4)."""

import fractions

import pytest
import torch

from tpustream.train import checkpoint


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"model": {"w": torch.zeros(64, 64)}}, good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:3000])
    pickled = tmp_path / "pickled.pt"
    torch.save({"model": {}, "lr": fractions.Fraction(1, 3)}, pickled)  # a global weights_only refuses
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file\n")
    directory = tmp_path / "dir.pt"
    directory.mkdir()
    return {"good": good, "truncated": truncated, "pickled": pickled, "garbage": garbage, "dir": directory}


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("truncated", "is unreadable (PytorchStreamReader failed reading zip archive"),
        (
            "pickled",
            "is unreadable (it pickles fractions.Fraction, which a weights-only load refuses to run)",
        ),
        ("garbage", "is unreadable (not a file torch.load(weights_only=True) can read)"),
        ("dir", "is a directory, not a file"),
    ],
)
def test_an_unreadable_checkpoint_is_one_line(files, name, why):
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.load_checkpoint(str(files[name]))
    message = str(info.value)
    assert "\n" not in message and str(files[name]) in message and why in message, message
    assert "weights_only` argument" not in message and len(message) < 300, message
    if name != "dir":
        assert message.endswith("or use --resume never"), message
    assert checkpoint.load_checkpoint(str(files["good"]))["model"]["w"].shape == (64, 64)


def test_model_weights_carry_no_resume_advice(files):
    with pytest.raises(
        checkpoint.CheckpointError, match=r"^model weights .*\(it pickles fractions\.Fraction.*\)$"
    ):
        checkpoint.load_torch_file(str(files["pickled"]), what="model weights")


def test_resume_from_a_plain_file_says_what_resume_takes(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.latest_checkpoint_uri(str(notes))
    assert str(info.value) == (
        f"{notes} is a file, not a training output directory: give the output directory, or a checkpoint "
        "file whose name ends in .pt"
    )
    assert checkpoint.latest_checkpoint_uri(str(tmp_path)) is None  # a directory without checkpoints yet
