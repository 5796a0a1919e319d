"""The run report in a real browser: headless Chromium opens the page from disk and must draw every plot,
print nothing to its console and ask the network for nothing.

Chromium's own switches do the observing: ``--enable-logging=stderr`` prints each console message (an error,
an uncaught exception, a Content-Security-Policy refusal) as a ``CONSOLE`` line; ``--log-net-log`` records every
request, which ``--host-resolver-rules`` keeps from leaving the machine; ``--dump-dom`` returns the DOM after
the load event, where a small script injected into a copy of the page has written what each image measured.
``test_the_checks_catch_a_console_error_and_a_fetch`` runs the same checks on a page that breaks them, so each
check is known to be able to fail with the Chromium installed.

Debian's ``chromium-headless-shell`` package is the browser (CI's ``.ci/run`` installs it); without a Chromium
these tests are skipped. ``TPUSTREAM_REPORT_SCREENSHOT=FILE.png`` keeps the screenshot for a person to look at.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.common.report import PLOT_IDS, sample_facts
from tpustream.report.build import write_report

pytestmark = pytest.mark.integration

CHROMIUM_NAMES = (
    "chromium-headless-shell",
    "chromium",
    "chromium-browser",
    "google-chrome",
    "headless_shell",
)
CHROMIUM_PATHS = (
    "/usr/lib/chromium/chromium-headless-shell",
    "/usr/lib/chromium/headless_shell",
    "/usr/lib/chromium/chromium",
)
WINDOW = (1280, 4000)
# Written into the DOM on load: per image, its figure's id, its decoded width (0: the image did not decode)
# and its box on the page; and how many inline SVGs there are.
PROBE = """<script>addEventListener("load", () => {
  const images = [...document.images].map((image) => {
    const box = image.getBoundingClientRect();
    const figure = image.closest("figure");
    return {id: figure ? figure.id : "", natural: image.naturalWidth, x: box.left + scrollX, y: box.top + scrollY,
            width: box.width, height: box.height};
  });
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({images, svgs: document.querySelectorAll("svg").length});
  document.body.append(probe);
});</script>"""
DATA_CHECK = (
    "# Data check: `gs://bucket/data/ab12`\n\n**1 anomaly**\n\nBaseline: none\n\n## Anomalies\n\n"
    "| Check | Reason |\n|---|---|\n| `skipped-rate` | 6.00% of the source's items were skipped \\| limit 5.00% |\n"
)


def chromium() -> str:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    for path in CHROMIUM_PATHS:
        if os.access(path, os.X_OK):
            return path
    pytest.skip(
        "no headless Chromium on this machine: `apt-get install chromium-headless-shell` (Debian) to run the "
        "run report's browser test"
    )


@dataclass
class PageRun:
    """What Chromium saw while opening one page."""

    console: list[str]  # console messages, uncaught exceptions, CSP refusals
    requests: list[str]  # the http(s)/ws(s) URLs the page asked the network for
    probe: dict[str, Any] | None  # what PROBE wrote, when the page carried it


def open_page(page: Path, work: Path, *, screenshot: Path | None = None) -> PageRun:
    net_log = work / f"{page.stem}-net-log.json"
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",  # the tests run as root
        "--disable-gpu",
        f"--user-data-dir={work / f'{page.stem}-profile'}",
        "--no-first-run",
        "--disable-background-networking",  # only the page's own requests in the net log
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--log-net-log={net_log}",
        "--hide-scrollbars",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--dump-dom",
    ]
    if screenshot is not None:
        command.append(f"--screenshot={screenshot}")
    result = subprocess.run(command + [page.as_uri()], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    requests = sorted(set(re.findall(r'"url":"((?:https?|wss?)://[^"]*)"', net_log.read_text())))
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.DOTALL)
    return PageRun(console, requests, json.loads(html.unescape(found.group(1))) if found else None)


def with_probe(page: Path) -> Path:
    """A copy of ``page`` carrying PROBE, its Content-Security-Policy removed: the policy would block the probe,
    and without it any external reference is really requested and shows in the net log."""
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    probed = page.with_name(f"{page.stem}-probed.html")
    probed.write_text(text.replace("</body>", PROBE + "</body>"))
    return probed


def colours(image: Image.Image) -> int:
    return len(image.getcolors(maxcolors=1 << 20) or [])


def test_the_report_renders_in_chromium_with_every_plot_and_nothing_fetched(tmp_path):
    page = tmp_path / "report.html"
    write_report(sample_facts(data_check_markdown=DATA_CHECK), str(page), str(tmp_path / "report.md"))
    screenshot = tmp_path / "report.png"

    as_written = open_page(page, tmp_path, screenshot=screenshot)
    assert as_written.console == []
    assert as_written.requests == []

    probed = open_page(with_probe(page), tmp_path)
    assert probed.console == []
    assert probed.requests == []
    assert probed.probe is not None
    images = probed.probe["images"]
    assert [image["id"] for image in images] == PLOT_IDS
    for image in images:
        assert image["natural"] > 0, f"{image['id']} did not decode"
        assert image["width"] > 200 and image["height"] > 100, image

    if target := os.environ.get("TPUSTREAM_REPORT_SCREENSHOT"):
        shutil.copyfile(screenshot, target)
    shot = Image.open(screenshot).convert("RGB")
    assert shot.size == WINDOW
    assert colours(shot) > 500  # text, tables and plots: not a blank or single-colour page
    in_view = [image for image in images if image["y"] + image["height"] <= WINDOW[1]]
    assert len(in_view) >= 3
    for image in in_view:  # each plot's box in the screenshot holds a drawing, not an empty frame
        box = (image["x"], image["y"], image["x"] + image["width"], image["y"] + image["height"])
        region = shot.crop(tuple(round(v) for v in box))
        assert colours(region) > 50, image["id"]
        not_white = (np.asarray(region, dtype=np.int32).sum(axis=2) < 720).mean()
        assert not_white > 0.03, image["id"]


def test_the_checks_catch_a_console_error_and_a_fetch(tmp_path):
    """The checks above, on a page that breaks each: they are seen to fail with this Chromium."""
    broken = tmp_path / "broken.html"
    broken.write_text(
        '<!DOCTYPE html><html><body><figure id="gone"><img src="https://example.com/plot.png"></figure>'
        '<figure id="bad"><img src="data:image/svg+xml;base64,AAAA"></figure>'
        '<script>console.error("report-check-canary")</script></body></html>'
    )
    run = open_page(with_probe(broken), tmp_path)
    assert any("report-check-canary" in line for line in run.console)
    assert run.requests == ["https://example.com/plot.png"]
    assert run.probe is not None
    assert [(image["id"], image["natural"]) for image in run.probe["images"]] == [("gone", 0), ("bad", 0)]

    guarded = tmp_path / "guarded.html"  # the report's policy refuses the fetch, and says so on the console
    guarded.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        'img-src data:"></head><body><img src="https://example.com/plot.png"></body></html>'
    )
    run = open_page(guarded, tmp_path)
    assert any("Content Security Policy" in line for line in run.console)


def test_the_mistakes_gallery_and_the_threshold_curve_decode_in_chromium(tmp_path):
    """Issue 34: the report's thumbnails (JPEG data URIs) and the threshold curve are drawn by a real browser,
    with nothing fetched and nothing on the console."""
    import base64
    import io
    from dataclasses import replace

    from tests.common.report import CLASSES
    from tpustream.report.mistakes import Mistake

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 24, 3), np.uint8)).save(buffer, "JPEG")
    picture = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
    mistakes = [
        Mistake(key=f"k{i}", source=f"gs://b/images/{i}.jpg", true_class=CLASSES[i % 4],
                predicted_class=CLASSES[(i + 1) % 4], confidence=0.9 - i / 100)
        for i in range(6)
    ]  # fmt: skip
    facts = sample_facts(mistakes=mistakes, thumbnails={m.key: picture for m in mistakes})
    thresholds = [{"threshold": t / 100, "precision": 0.7 + t / 400, "recall": 0.7 - t / 150,
                   "coverage": 1 - t / 110, "f1": 0.6} for t in range(100)]  # fmt: skip
    per_class = {"precision": [0.9, 0.5, 0.8, 0.7], "recall": [0.95, 0.6, 0.7, 0.8],
                 "f1": [0.92, 0.55, 0.75, 0.75], "support": [20, 20, 20, 20], "auprc": [0.9, 0.6, 0.8, 0.8]}  # fmt: skip
    candidate = replace(
        facts.metrics.candidate,
        per_class=per_class,
        thresholds=thresholds,
        macro_f1=0.74,
        balanced_accuracy=0.76,
        auprc=0.8,
    )
    facts = replace(facts, metrics=replace(facts.metrics, candidate=candidate))
    page = tmp_path / "report.html"
    write_report(facts, str(page), str(tmp_path / "report.md"))
    assert open_page(page, tmp_path).console == []  # as written, with its Content-Security-Policy
    probed = open_page(with_probe(page), tmp_path)
    assert probed.console == [] and probed.requests == [] and probed.probe is not None
    images = probed.probe["images"]
    thumbnails = [image for image in images if image["id"] == ""]  # the gallery's figures carry no id
    assert len(thumbnails) == 6 and all(image["natural"] == 24 for image in thumbnails), thumbnails
    (curve,) = [image for image in images if image["id"] == "plot-thresholds"]
    assert curve["natural"] > 0 and curve["width"] > 200
