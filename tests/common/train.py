"""`tpustream train` as a real subprocess on PJRT CPU (the XLA runtime is process-global): the command, a run,
and a run signalled mid-epoch."""

from __future__ import annotations

import os
import subprocess
import sys

ENV = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4", "TF_CPP_MIN_LOG_LEVEL": "2"}
FAST = ["--model", "tiny", "--batch-size", "16", "--workers", "2", "--lr", "0.2", "--log-steps", "5"]


def train_command(data, output, *args):
    return [
        sys.executable,
        "-m",
        "tpustream.cli",
        "train",
        "--data",
        data,
        "--output",
        str(output),
        *FAST,
        *args,
    ]


def run_train(data, output, *args, env=ENV, timeout=400):
    return subprocess.run(
        train_command(data, output, *args), env=env, capture_output=True, text=True, timeout=timeout
    )


def signal_mid_epoch(data, output, signum, at="epoch 2 step 35"):
    """A 3-epoch run sent ``signum`` once its log shows ``at``; returns (exit code, its whole stderr)."""
    proc = subprocess.Popen(
        train_command(data, output, "--epochs", "3"),
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if at in line:
            proc.send_signal(signum)
            break
    rest = proc.stderr.read()  # not communicate(): with a timeout it reads the pipe past the text buffer
    proc.wait(timeout=300)
    return proc.returncode, "".join(seen) + rest
