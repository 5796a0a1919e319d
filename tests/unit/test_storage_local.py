"""Local files written through the storage seam get the mode a plain open() would give them."""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import os, sys
os.umask(int(sys.argv[1], 8))
from tpustream.storage import io as storage
storage.write_bytes(sys.argv[2], b"x")
storage.write_bytes(sys.argv[2] + ".once", b"x", create_only=True)
src = sys.argv[2] + ".src"
open(src, "wb").write(b"x")
storage.upload_file(src, sys.argv[2] + ".uploaded")
with storage.open_write(sys.argv[2] + ".streamed") as f:
    f.write(b"x")
"""


@pytest.mark.parametrize(("umask", "expected"), [("022", 0o644), ("027", 0o640), ("077", 0o600)])
def test_written_files_follow_the_umask(tmp_path, umask, expected):
    # A fresh process, so the umask set there is the process's own.
    target = str(tmp_path / "obj")
    subprocess.run([sys.executable, "-c", SCRIPT, umask, target], check=True)
    for path in (target, target + ".once", target + ".uploaded", target + ".streamed"):
        assert os.stat(path).st_mode & 0o777 == expected, path
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]


def test_open_write_publishes_only_a_finished_file(tmp_path):
    from tpustream.storage import io as storage

    target = str(tmp_path / "sub" / "obj")
    with pytest.raises(RuntimeError), storage.open_write(target) as f:
        f.write(b"half")
        raise RuntimeError("writer died")
    assert not os.path.exists(target)
    assert os.listdir(tmp_path / "sub") == []  # no temp file left either
    with storage.open_write(target) as f:
        f.write(b"whole")
        assert not os.path.exists(target)  # not under its name while being written
    assert storage.read_bytes(target) == b"whole"
    assert os.listdir(tmp_path / "sub") == ["obj"]


def test_a_file_where_a_directory_is_expected_names_the_file(tmp_path):
    # `evaluate --model notes.txt`, `shards verify notes.txt`, ...: once a NotADirectoryError traceback
    from tpustream.storage import io as storage

    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    inside = f"{notes}/sub/manifest.json"
    expected = f"{notes} is a file where a directory is expected (for {inside}): give a directory or a gs:// prefix instead"
    for call in (
        lambda: storage.read_bytes(inside),
        lambda: storage.open_read(inside),
        lambda: storage.stat(inside),
        lambda: storage.read_with_generation(inside),
        lambda: storage.write_bytes(inside, b"x"),
        lambda: storage.replace_if_generation(inside, b"x", 0),
        lambda: storage.copy(inside, str(tmp_path / "copy")),
        lambda: storage.ensure_prefix_writable(f"{notes}/sub"),
    ):
        with pytest.raises(storage.PathKindError) as info:
            call()
        assert str(info.value) in (expected, expected.replace(inside, f"{notes}/sub")), str(info.value)
    assert notes.read_text() == "x" and not storage.exists(inside)


def test_a_directory_where_a_file_is_expected(tmp_path):
    from tpustream.storage import io as storage

    for call in (
        lambda: storage.read_bytes(str(tmp_path)),
        lambda: storage.read_with_generation(str(tmp_path)),
        lambda: storage.copy(str(tmp_path), str(tmp_path / "copy")),
    ):
        with pytest.raises(
            storage.PathKindError, match="is a directory, not a file: give the path of a file"
        ):
            call()
    with pytest.raises(storage.NotFound):
        storage.copy(str(tmp_path / "missing"), str(tmp_path / "copy"))


@pytest.mark.parametrize(
    ("uri", "path"),
    [("file:///abs/x", "/abs/x"), ("file://localhost/abs/x", "/abs/x"), ("file:/abs/x", "/abs/x"),
     ("file://rel/x", "rel/x"), ("/abs/x", "/abs/x")],
)  # fmt: skip
def test_file_uris_are_local_paths(uri, path):
    from tpustream.storage import io as storage

    assert storage.check_uri(uri) == path


def test_a_file_uri_never_makes_a_directory_named_file_colon(tmp_path, monkeypatch):
    from tpustream.storage import io as storage

    monkeypatch.chdir(tmp_path)
    storage.write_bytes(f"file://{tmp_path}/a/obj", b"1")
    storage.write_bytes(f"file:{tmp_path}/b/obj", b"2")
    storage.ensure_prefix_writable(f"file://{tmp_path}/c")
    for bad in ("file:rel/obj", "file://", "file:"):
        with pytest.raises(storage.StorageError, match="give file:///ABSOLUTE/PATH or a plain path"):
            storage.write_bytes(bad, b"x")
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]
