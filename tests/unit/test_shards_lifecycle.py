"""What `shards create` leaves behind around the shards: an old dataset under --overwrite, file modes,
temp files of killed writers, and the writer processes themselves."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.common.shards import crashing_source as _crashing
from tests.common.shards import shard_config as _config
from tests.common.sources import make_image_folder
from tpustream.cli.options import field_docs
from tpustream.dataset import finalize
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import ShardError, verify_shards
from tpustream.dataset.plan import ShardConfig
from tpustream.sources.dispatch import open_source
from tpustream.sources.types import SourceError
from tpustream.storage import io as storage


def _complete_dataset(out):
    shards.create_shards(_config(out, num_shards=4), progress=False)
    assert verify_shards(str(out), progress=False) == (5, [])


def test_overwrite_failing_checks_leave_the_old_dataset_readable(tmp_path):
    out = tmp_path / "ds"
    _complete_dataset(out)
    with pytest.raises(ShardError, match="cannot fill 19 shards"):  # a plan error
        shards.create_shards(
            _config(out, source="synthetic-cifar:20", num_shards=19, overwrite=True), progress=False
        )
    with pytest.raises(SourceError):  # a source error
        shards.create_shards(_config(out, source=str(tmp_path / "nowhere"), overwrite=True), progress=False)
    images = make_image_folder(tmp_path / "img")
    (images / "cat" / "notes.txt").write_text("x")
    with pytest.raises(ShardError, match="--strict"):  # a usage error
        shards.create_shards(
            _config(out, source=str(images), num_shards=2, overwrite=True, strict=True), progress=False
        )
    assert verify_shards(str(out), progress=False) == (5, [])
    assert shards.check_output(str(out), overwrite=True) is True  # checking changes nothing
    assert (out / "manifest.json").exists()


def test_overwrite_keeps_the_old_dataset_valid_until_the_new_one_is_complete(tmp_path, caplog):
    out = tmp_path / "ds"
    _complete_dataset(out)
    old_manifest = (out / "manifest.json").read_bytes()
    with pytest.raises(RuntimeError, match="power cut"):
        shards.create_shards(
            _config(out, num_shards=3, overwrite=True), progress=False,
            source=_crashing(open_source("digits"), after=700),
        )  # fmt: skip
    # the old dataset as it was: same manifest, every shard matching it; the new one waits beside it
    assert (out / "manifest.json").read_bytes() == old_manifest
    assert verify_shards(str(out), progress=False) == (5, [])
    assert (out / finalize.REPLACEMENT_DIR / "_records").is_dir()
    with caplog.at_level("WARNING"):  # re-running resumes the replacement, then swaps it in
        manifest, summary = shards.create_shards(_config(out, num_shards=3, overwrite=True), progress=False)
    assert summary.reused_shards > 0 and "replacing the dataset" in caplog.text
    assert len(manifest.splits["train"].shards) == 3
    assert verify_shards(str(out), progress=False) == (4, [])  # 3 train + 1 val, no old shard left over
    assert sorted(os.listdir(out / "train")) == [f"train-{i:06d}.tar" for i in range(3)]
    assert not (out / finalize.REPLACEMENT_DIR).exists() and not (out / "_records").exists()
    # --overwrite's help (the field's docstring) says what happened here, not that the old manifest goes first
    help_text = " ".join(field_docs(ShardConfig)["overwrite"].split())
    assert (
        "old one stays valid until then, even if this run fails" in help_text and "removed" not in help_text
    )


def test_overwrite_strict_stopping_on_a_bad_image_leaves_the_old_dataset(tmp_path):
    """The issue's case: `shards create --overwrite --strict` used to delete a good dataset, then stop."""
    out = tmp_path / "ds"
    images = make_image_folder(tmp_path / "img")
    shards.create_shards(_config(out, source=str(images), num_shards=2), progress=False)
    before = (out / "manifest.json").read_bytes()
    (images / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(ShardError, match="--strict: stopping"):
        shards.create_shards(
            _config(out, source=str(images), num_shards=2, overwrite=True, strict=True), progress=False
        )
    assert (out / "manifest.json").read_bytes() == before
    assert verify_shards(str(out), progress=False)[1] == []


def test_a_swap_cut_off_midway_is_finished_by_the_next_run(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    _complete_dataset(out)
    real_move, moves = storage.move, []

    def move_then_die(src, dst):
        if len(moves) == 2:
            raise RuntimeError("power cut")
        moves.append(dst)
        real_move(src, dst)

    monkeypatch.setattr(storage, "move", move_then_die)
    with pytest.raises(RuntimeError, match="power cut"):
        shards.create_shards(_config(out, num_shards=2, overwrite=True), progress=False)
    assert not (out / "manifest.json").exists()  # neither the old dataset nor a mixed one is advertised
    monkeypatch.setattr(storage, "move", real_move)
    assert finalize.finish_replacement(str(out)) is True
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["splits"]["train"]["shards"]) == 2
    assert verify_shards(str(out), progress=False) == (3, [])
    assert not (out / finalize.REPLACEMENT_DIR).exists()
    assert finalize.finish_replacement(str(out)) is False


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)], ids=["umask022", "umask027"])
def test_local_shards_follow_the_umask(tmp_path, umask, mode):
    """Not mkstemp's 0o600: a shared dataset directory must be readable by the others it is shared with."""
    previous = os.umask(umask)
    try:
        manifest, _ = shards.create_shards(_config(tmp_path / "ds", num_shards=2, workers=2), progress=False)
    finally:
        os.umask(previous)
    paths = [s.path for s in manifest.all_shards()]
    assert [oct(os.stat(tmp_path / "ds" / p).st_mode & 0o777) for p in paths] == [oct(mode)] * len(paths)


def test_resume_removes_temp_files_of_killed_writers(tmp_path):
    out = tmp_path / "ds"
    config = _config(out, num_shards=6)
    with pytest.raises(RuntimeError, match="power cut"):
        shards.create_shards(config, progress=False, source=_crashing(open_source("digits"), after=700))
    leftovers = [out / "train" / ".train-000004.tar.k1ll3d.partial", out / "_records" / ".x.json.abc.partial"]
    for path in leftovers:  # what a SIGKILLed writer leaves: its temp file, never renamed
        path.write_bytes(b"half a shard")
    _, summary = shards.create_shards(config, progress=False)
    assert summary.reused_shards > 0
    assert not any(path.exists() for path in leftovers)
    assert sorted(os.listdir(out / "train")) == [f"train-{i:06d}.tar" for i in range(6)]
    assert not (out / "_records").exists()


def _children(pid):
    """PIDs whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_sigkilled_create_takes_its_writer_processes_with_it(tmp_path):
    cmd = [sys.executable, "-m", "tpustream.cli.main", "shards", "create", "--source", "synthetic-imagenet:4000",
           "--output", str(tmp_path / "ds"), "--num-shards", "16", "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            workers = _children(proc.pid)
        assert len(workers) >= 2, "the writer processes never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in workers if _alive(pid)], "writers outlived the killed `shards create`"
        assert not storage.exists(str(tmp_path / "ds" / "manifest.json"))
    finally:
        proc.kill()
        for pid in workers:  # orphans, were the fix broken: do not leave them writing
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
