"""Report a trial's metric to Vertex AI Vizier the ``cloudml-hypertune`` way, in the few lines that package is.

Vertex AI's hyperparameter tuning reads a trial's measurements from the file named by ``CLOUD_ML_HP_METRIC_FILE``
(default ``/tmp/hypertune/output.metrics``): the whole file rewritten on each report, one JSON object per line,
newest last, at most 100 kept, each ``{"checkpoint_path": "", "global_step": "<step>", "<metric tag>":
"<value>", "timestamp": <seconds>, "trial": "<CLOUD_ML_TRIAL_ID>"}`` with ``sort_keys`` (cloudml-hypertune
0.1.0.dev6, ``hypertune/hypertune.py``, ``HyperTune.report_hyperparameter_tuning_metric``:
https://github.com/GoogleCloudPlatform/cloudml-hypertune). That package has not been released since 2019 and
is not a dependency: this module writes the same lines. ``global_step`` is the epoch here, so that the
service's early stopping compares trials epoch by epoch.
"""

from __future__ import annotations

import collections
import json
import os
import time

__all__ = ["DEFAULT_METRIC_FILE", "HypertuneReporter"]

DEFAULT_METRIC_FILE = "/tmp/hypertune/output.metrics"
_KEPT = 100  # cloudml-hypertune's _MAX_NUM_METRIC_ENTRIES_TO_PRESERVE


class HypertuneReporter:
    """Writes each reported metric to the trial's metric file, as cloudml-hypertune's ``HyperTune`` does."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.path = env.get("CLOUD_ML_HP_METRIC_FILE", DEFAULT_METRIC_FILE)
        self.trial = str(env.get("CLOUD_ML_TRIAL_ID", 0))
        self.lines: collections.deque[dict[str, object]] = collections.deque(maxlen=_KEPT)

    def report(self, tag: str, value: float, step: int) -> None:
        """Append ``tag`` = ``value`` at ``step`` and rewrite the file (the service reads it whole)."""
        self.lines.append(
            {
                "timestamp": time.time(),
                "trial": self.trial,
                tag: str(float(value)),
                "global_step": str(int(step)),
                "checkpoint_path": "",
            }
        )
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "w") as file:
            for line in self.lines:
                file.write(json.dumps(line, sort_keys=True) + "\n")
