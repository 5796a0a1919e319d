"""``tpustream dev gcs-server`` (tpustream/cli/dev.py), as README tells a reader to start it: a real process
that serves the GCS API on loopback, prints the ``STORAGE_EMULATOR_HOST`` line, answers a google-cloud-storage
client, and stops on Ctrl-C (SIGINT) taking fake-gcs-server with it. Every wait is bounded."""

import os
import selectors
import signal
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

STARTUP_S = 60


def _first_line(process: subprocess.Popen[str]) -> str:
    """The process's first stdout line, or a failure after STARTUP_S (never a hang)."""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    if not selector.select(timeout=STARTUP_S):
        pytest.fail(f"no line from `tpustream dev gcs-server` within {STARTUP_S} s")
    return process.stdout.readline().strip()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_gcs_server_prints_the_emulator_line_answers_a_client_and_stops_on_ctrl_c(tmp_path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    command = [sys.executable, "-m", "tpustream.cli", "dev", "gcs-server", "--bucket", "demo"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        line = _first_line(process)
        prefix = "export STORAGE_EMULATOR_HOST=http://127.0.0.1:"
        assert line.startswith(prefix), line
        port = int(line.removeprefix(prefix))
        client = storage.Client(
            project="dev",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": line.split("=", 1)[1]},
        )
        blob = client.bucket("demo").blob("hello.txt")
        blob.upload_from_string(b"hello", timeout=30)
        assert client.bucket("demo").blob("hello.txt").download_as_bytes(timeout=30) == b"hello"
        assert [b.name for b in client.list_blobs("demo", timeout=30)] == ["hello.txt"]
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group, server too
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    assert process.returncode == 0, err
    assert "gcs-server stopped" in err
    deadline = time.monotonic() + 10  # fake-gcs-server was terminated: nothing listens on its port
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _listening(port)


def test_a_port_in_use_is_one_clear_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tpustream.cli", "dev", "gcs-server", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode == 2, done.stderr
    assert f"--port {port}: 127.0.0.1:{port} is not free" in done.stderr
    assert "give another port, or 0 for a free one" in done.stderr
