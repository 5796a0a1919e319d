"""Local files written through the storage seam get the mode a plain open() would give them."""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import os, sys
os.umask(int(sys.argv[1], 8))
from tpustream import storage
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
    from tpustream import storage

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
