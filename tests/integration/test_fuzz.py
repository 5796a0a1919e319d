"""Fuzz the loader with mutated real shards and images (tests/common/fuzz_loader.py), seeded and time-bounded.

The cases run in a child process with a per-case watchdog, so a hang fails the test naming its case
instead of blocking the suite. Cases that once failed are kept, as explicit bytes, in
tests/unit/test_fuzz_regressions.py.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2)  # ~120 cases each, ~10 s each on 2 cores
TOTAL_TIMEOUT_S = 240


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_shards_and_images_never_hang_crash_or_misreport(tmp_path, seed):
    try:
        run = subprocess.run(
            [sys.executable, "-m", "tests.common.fuzz_loader", str(seed), "1000", str(tmp_path)],
            cwd=ROOT, capture_output=True, text=True, timeout=TOTAL_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"fuzz run over {TOTAL_TIMEOUT_S}s; last output: {str(exc.stdout)[-2000:]}")
    lines = run.stdout.splitlines()
    started = [line for line in lines if line.startswith("START ")]
    results = [json.loads(line[len("RESULT ") :]) for line in lines if line.startswith("RESULT ")]
    assert run.returncode == 0, (
        f"the fuzz run died (exit {run.returncode}) in case {started[-1] if started else '(setup)'}: a hang "
        f"is killed by the per-case watchdog; stderr tail:\n{run.stderr[-3000:]}"
    )
    total = int(next(line for line in lines if line.startswith("CASES "))[len("CASES ") :])
    assert total > 100 and len(results) == total
    failures = [f"{r['case']}:\n{r['traceback']}" for r in results if r["status"] != "ok"]
    assert not failures, f"{len(failures)} of {total} cases failed; first:\n" + "\n".join(failures[:3])
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    # the fuzzer really exercised the fallbacks: bad shards, unread samples and undecodable samples seen
    assert sum(r["val"]["bad_shards"] + r["train"]["bad_shards"] for r in results) > 50
    assert sum(r["val"]["undecodable"] for r in results) > 10
