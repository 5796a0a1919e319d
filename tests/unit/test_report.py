"""The run report (tpustream/report/build.py and its report_facts, report_html, report_markdown): facts built by
hand, the page and the summary checked for what a user relies on: the decision told right, the class beyond
max_class_drop marked, every user string escaped, nothing fetched from the network, a plot per section, and
missing data said instead of crashing; ``write_run_report`` on a run's files and a registry."""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import replace
from typing import Any

import pytest

from tests.common.report import CLASSES, EVIL, PLOT_IDS, epochs, evaluation, history, manifest, sample_facts
from tests.common.report import model_card as _card
from tpustream.artifacts import Evaluation
from tpustream.models import model_spec
from tpustream.registry.policy import Decision, PromotionPolicy, decide
from tpustream.release.promote import PromotionOutcome
from tpustream.report import build as report
from tpustream.report.build import (
    ReportError,
    ReportFacts,
    build_report_facts,
    render_report,
    write_report,
    write_run_report,
)

SVG_NAMESPACES = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}


@pytest.fixture(scope="module")
def rendered() -> tuple[str, str]:
    return render_report(sample_facts())


def svg_documents(page: str) -> list[str]:
    return [
        base64.b64decode(data).decode()
        for data in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', page)
    ]


def external_references(page: str) -> list[str]:
    """Every place the page or one of its SVGs could fetch from the network: src/href/srcset/action/poster
    attributes, CSS url() and @import, anything not an in-page #anchor or a data: URI. A namespace name
    (xmlns="http://www.w3.org/2000/svg") is an identifier, never fetched: allowed, and only those two."""
    found = []
    for document in [page, *svg_documents(page)]:
        for name, value in re.findall(r'([\w:-]+)\s*=\s*"([^"]*)"', document):
            name = name.lower()
            if name in ("xmlns", "xmlns:xlink"):
                if value not in SVG_NAMESPACES:
                    found.append(f"{name}={value}")
            elif name.split(":")[-1] in (
                "src",
                "href",
                "srcset",
                "action",
                "poster",
            ) and not value.startswith(("#", "data:")):
                found.append(f"{name}={value}")
        found += re.findall(r"url\(\s*['\"]?(?!data:|#)[^)]*\)|@import", document)
        without_namespaces = re.sub(
            r'xmlns(:xlink)?="http://www\.w3\.org/(2000/svg|1999/xlink)"', "", document
        )
        found += [
            f"text: {match}" for match in re.findall(r"(?:https?|ftp|wss?)://[^\s\"'<>]*", without_namespaces)
        ]
    return found


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The body rows of the first table under ``heading``, as cells."""
    lines = markdown.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line[1:-1])] for line in lines[start + 2 : end]]


# --------------------------------------------------------------------------- the decision


def test_a_refusal_for_a_class_drop_names_the_class_and_its_accuracies(rendered):
    page, markdown = rendered
    sentence = (
        "Refused, the champion stays: class “dog” accuracy drops by 30.0 points (90.0% → 60.0%), more than "
        "max_class_drop allows (10.0 points)."
    )
    assert f'<p class="sentence">{sentence}</p>' in page
    assert '<header id="decision" class="refused"><h1>Refused</h1>' in page
    assert "# Run report: Refused" in markdown
    assert sentence.replace("_", "\\_") in markdown
    # the headline: candidate vs the champion it was measured against
    assert "champion (version 2)" in page
    assert '<td>80.00%</td><td>76.25%</td><td><span class="better">+3.75 points</span></td>' in page


def test_other_refusals_keep_the_policys_reason():
    facts = sample_facts(
        decision=Decision(
            False,
            "candidate top1 0.7000 vs champion 0.7500: improvement -0.0500 is not above 0",
            "no-improvement",
        )
    )
    page, markdown = render_report(facts)
    assert (
        "Refused, the champion stays: candidate top1 0.7000 vs champion 0.7500: improvement -0.0500 is not above 0."
        in page
    )


def test_a_promotion_states_the_version_and_the_one_it_replaced():
    outcome = PromotionOutcome(
        promoted=True,
        version=3,
        reason="candidate top1 0.8000 beats champion 0.7500 by +0.0500",
        code="wins",
        previous_version=2,
    )
    page, markdown = render_report(
        sample_facts(outcome=outcome, decision=outcome.decision, policy=PromotionPolicy())
    )
    assert '<header id="decision" class="promoted"><h1>Promoted as version 3</h1>' in page
    assert (
        "the candidate is now champion version 3 (replacing version 2): candidate top1 0.8000 beats" in page
    )
    assert "# Run report: Promoted as version 3" in markdown
    assert 'class="exceeds"' not in page  # no max_class_drop: no class is marked


def test_the_champion_itself_is_already_the_champion():
    outcome = PromotionOutcome(
        promoted=False, version=2, reason="already the champion", code="already-champion"
    )
    page, _ = render_report(sample_facts(outcome=outcome, decision=outcome.decision))
    assert "Nothing to promote: the candidate is already the champion (version 2)." in page


def test_the_verdict_comes_from_the_decisions_code_not_from_its_words(rendered):
    """Reworded reasons leave the report's facts as they were: the class a class-drop names and an
    already-champion outcome are read from the code and the class index, never parsed out of the sentence."""
    facts = sample_facts()
    assert facts.decision.code == "class-drop" and facts.decision.class_index is not None
    reworded = replace(facts, decision=replace(facts.decision, reason="per-class check failed (reworded)"))
    page, _ = render_report(reworded)
    dropped = re.search(r'<p class="sentence">(.*?)</p>', rendered[0])
    assert dropped is not None and "class “dog” accuracy drops by" in dropped.group(1)
    assert f'<p class="sentence">{dropped.group(1)}</p>' in page  # the same verdict, word for word
    # a sentence that reads like a class drop but is not one is said as it is
    lookalike = Decision(False, "class 1 accuracy drops by 0.3000 and more", "no-improvement")
    page, _ = render_report(replace(facts, decision=lookalike))
    assert "Refused, the champion stays: class 1 accuracy drops by 0.3000 and more." in page
    # already the champion in other words is still already the champion; those words alone are not
    same = PromotionOutcome(
        promoted=False, version=4, reason="this model is the champion", code="already-champion"
    )
    page, _ = render_report(sample_facts(outcome=same, decision=same.decision))
    assert "Nothing to promote: the candidate is already the champion (version 4)." in page
    words = Decision(False, "already the champion", "not-compared")
    page, _ = render_report(sample_facts(decision=words))
    assert "<h1>Already the champion</h1>" not in page and "Refused, the champion stays" in page


# --------------------------------------------------------------------------- per-class accuracy


def test_the_class_beyond_max_class_drop_is_marked_in_the_page(rendered):
    page, _ = rendered
    marked = re.findall(r'<tr class="exceeds"><td>(.*?)</td>', page)
    assert marked == ["dog"]
    assert (
        '<tr class="exceeds"><td>dog</td><td>60.0%</td><td>90.0%</td><td>+30.0</td><td>yes</td><td>20</td></tr>'
        in page
    )


def test_the_markdown_per_class_table_lists_the_largest_drop_first(rendered):
    _, markdown = rendered
    rows = table_rows(markdown, "## Per-class accuracy")
    assert rows[0] == ["**dog**", "60.0%", "90.0%", "+30.0", "**yes**", "20"]
    names = [row[0] for row in rows]
    assert names == ["**dog**", "&lt;script&gt;alert(1)&lt;/script&gt;", "cat", "bird &amp; fish"]
    assert [row[4] for row in rows[1:]] == ["", "", ""]


def test_many_classes_are_capped_with_every_class_beyond_the_limit_kept():
    classes = [f"class-{i:02d}" for i in range(40)]
    correct = [15] * 40
    champion_correct = [15] * 40
    champion_correct[39] = 20  # class-39 drops 25 points: beyond the limit, and listed although last in order
    metrics = replace(
        sample_facts().metrics,
        classes=classes,
        candidate=Evaluation.from_json(evaluation(correct, loss=0.5)),
        champion=Evaluation.from_json(evaluation(champion_correct, loss=0.6, version=2)),
    )
    facts = sample_facts(
        metrics=metrics,
        model_card=_card({"arch": "resnet18", "classes": classes, "history": epochs(2)}),
        manifest=manifest(classes),
        history=None,
    )
    page, markdown = render_report(facts)
    rows = table_rows(markdown, "## Per-class accuracy")
    assert len(rows) == 20 and rows[0][0] == "**class-39**"
    assert "20 more classes, with smaller drops, are not listed." in markdown
    assert "30 of 40 classes are shown: those with the most errors" in page
    assert "The 30 classes with the largest drops, of 40." in page


def test_top5_is_shown_only_with_more_than_5_classes(rendered):
    """4 classes: every top 5 holds the label, top-5 is 100% by construction: no headline row, no epoch-table
    column, no curve (unless the decision was taken on it); 40 classes: all three."""
    from tpustream.report.facts import shows_top5
    from tpustream.report.plots import curves_svg

    assert [shows_top5(n) for n in (3, 5, 6)] == [False, False, True]
    page, markdown = rendered
    assert [row[0] for row in table_rows(markdown, "Policy: decide on")] == [
        "top-1 (decides)",
        "loss",
        "val samples",
    ]
    assert "top-5" not in markdown and "top-5" not in page
    history = sample_facts().model_card.history
    assert svg_documents(page)[0] == curves_svg(history, top5=False) != curves_svg(history)

    decided_on_top5 = render_report(sample_facts(policy=PromotionPolicy(metric="top5", max_class_drop=0.1)))[
        1
    ]
    assert "top-5 (decides)" in [row[0] for row in table_rows(decided_on_top5, "Policy: decide on")]

    classes = [f"class-{i:02d}" for i in range(40)]
    metrics = replace(
        sample_facts().metrics,
        classes=classes,
        candidate=Evaluation.from_json(evaluation([15] * 40, loss=0.5)),
        champion=None,
    )
    card = _card({"arch": "resnet18", "classes": classes, "history": epochs(2)})
    page, markdown = render_report(sample_facts(metrics=metrics, model_card=card, manifest=manifest(classes)))
    assert [row[0] for row in table_rows(markdown, "Policy: decide on")][:2] == ["top-1 (decides)", "top-5"]
    assert "<th>val top-5</th>" in page and svg_documents(page)[0] == curves_svg(card.history)


# --------------------------------------------------------------------------- escaping, self-containment


def test_user_strings_appear_only_escaped(rendered):
    page, markdown = rendered
    facts = sample_facts(
        model_card=_card(
            {
                "arch": 'resnet18"><b>x</b>',
                "classes": CLASSES,
                "history": epochs(3),
                "init": {"from": '"><b>'},
            }
        ),
    )
    page_with_odd_names, _ = render_report(facts)
    for document in (page, markdown, page_with_odd_names):
        assert EVIL not in document
        assert "<img src=x>" not in document
        assert "<b>" not in document
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in markdown
    assert "bird &amp; fish" in page
    for svg in svg_documents(page):  # matplotlib writes a text's characters into an SVG comment: escaped
        assert "<script" not in svg


def test_the_page_references_nothing_outside_itself(rendered):
    page, _ = rendered
    assert external_references(page) == []
    assert "Content-Security-Policy" in page and "<script" not in page


def test_the_reference_check_catches_a_fetch():
    """The check above is only worth something if it fails on a page that would fetch."""
    svg = '<svg xmlns="http://www.w3.org/2000/svg"><image href="https://example.com/a.png"/></svg>'
    image = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    assert external_references('<img src="https://example.com/a.png">')
    assert external_references('<link rel="stylesheet" href="//cdn.example.com/a.css">')
    assert external_references("<style>body{background:url(http://example.com/a.png)}</style>")
    assert external_references(f'<img src="{image}">')
    assert external_references('<svg xmlns="http://example.com/not-svg"></svg>')


def test_each_section_has_its_plot(rendered):
    page, _ = rendered
    for plot_id in PLOT_IDS:
        assert page.count(f'<figure id="{plot_id}">') == 1, plot_id
    svgs = svg_documents(page)
    assert len(svgs) == len(PLOT_IDS)
    for svg in svgs:
        root = ElementTree.fromstring(svg)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
    toc = re.findall(r'<li><a href="#([\w-]+)">', page)
    assert toc == ["training", "recipe", "confusion", "per-class", "dataset", "history"]
    assert all(f'<section id="{key}">' in page for key in toc)


def test_the_same_facts_give_the_same_page(rendered):
    assert render_report(sample_facts()) == rendered


# --------------------------------------------------------------------------- missing data


def test_no_champion_one_epoch_and_unmeasured_classes_are_said():
    measured = evaluation([19, 12, 17, 16], loss=math.nan)
    measured["per_class_accuracy"][2] = None
    candidate = Evaluation.from_json(measured)
    metrics = replace(sample_facts().metrics, candidate=candidate, champion=None)
    decision = decide(candidate, None, candidate_digest="d", champion_digest=None)
    facts = sample_facts(
        metrics=metrics,
        decision=decision,
        model_card=_card({"arch": "resnet18", "classes": CLASSES, "history": epochs(1)}),
        history=[],
    )
    page, markdown = render_report(facts)
    assert "Refused, the champion stays: candidate loss nan is not a finite number" in page
    assert "No champion numbers: there is no champion to compare with." in page
    assert "One epoch only: there is no curve to draw" in page
    assert "No registry events yet" in page and "No registry events yet." in markdown
    assert (
        "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td>not measured</td><td>none</td><td>not measured</td>"
        in page
    )
    assert "not finite" in page  # the NaN loss in the headline
    assert '<figure id="plot-curves">' not in page and '<figure id="plot-history">' not in page
    assert '<figure id="plot-confusion-champion">' not in page
    assert '<figure id="plot-per-class">' in page  # the candidate's bars alone


def test_a_champion_that_was_not_measured_is_said_with_evaluates_note():
    note = "champion version 3 not evaluated: the class sets differ"
    metrics = replace(sample_facts().metrics, champion=None, champion_note=note)
    facts = sample_facts(
        metrics=metrics,
        decision=Decision(False, f"{note}. Keeping champion version 3", "not-compared"),
        history=None,
    )
    page, markdown = render_report(facts)
    assert f"No champion numbers: the champion was not measured: {note}." in page
    assert "<td>not measured</td>" in page
    assert '<section id="history">' not in page and "## Champion history" not in markdown


def test_an_empty_model_history_and_no_manifest_render():
    facts = sample_facts(model_card=_card({"arch": "resnet18", "classes": CLASSES}), manifest=None)
    page, markdown = render_report(facts)
    assert "No per-epoch history in the model card: nothing to draw." in page
    assert "The manifest was not given" in page and "The manifest was not given." in markdown


def test_facts_refuse_an_unknown_metric():
    with pytest.raises(ValueError, match="metric 'f1'"):
        sample_facts(policy=PromotionPolicy(metric="f1"))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- data set, data check, history


def test_the_data_set_section_gives_splits_classes_and_skips(rendered):
    page, markdown = rendered
    assert "<tr><td>train</td><td>400</td><td>123,456</td><td>2</td></tr>" in page
    assert "<tr><td>undecodable</td><td>2</td></tr><tr><td>malformed-row</td><td>1</td></tr>" in page
    assert "Skipped: 3 (undecodable 2, malformed-row 1)." in markdown
    assert table_rows(markdown, "## Data set") == [["train", "400"], ["val", "80"]]


def test_the_data_check_markdown_becomes_a_section():
    text = (
        "# Data check: `gs://b/data`\n\n**1 anomaly**\n\n## Anomalies\n\n| Check | Reason |\n|---|---|\n"
        "| `train-val-leak` | 2 images in both train and val \\| see below <b> |\n\n"
        f"- `{EVIL}`: train\n- second\n"
    )
    page, markdown = render_report(sample_facts(data_check_markdown=text))
    section = page.split('<section id="data-check">', 1)[1].split("</section>", 1)[0]
    assert "<h3>Data check: <code>gs://b/data</code></h3>" in section
    assert "<p><strong>1 anomaly</strong></p>" in section
    assert (
        "<td><code>train-val-leak</code></td><td>2 images in both train and val | see below &lt;b&gt;</td>"
        in section
    )
    assert (
        f"<li><code>{EVIL.replace('<', '&lt;').replace('>', '&gt;')}</code>: train</li><li>second</li>"
        in section
    )
    assert "## Data check" in markdown and "### Data check: `gs://b/data`" in markdown


def test_the_history_table_shows_the_newest_events_first(rendered):
    page, _ = rendered
    _, markdown = render_report(sample_facts(history=history(12)))
    rows = table_rows(markdown, "## Champion history")
    assert len(rows) == 10
    assert [row[0] for row in rows[:2]] == ["2025-11-12T08:00:00Z", "2025-11-11T08:00:00Z"]
    assert rows[0][1:4] == ["refused", "", "top1 82.00%"]
    assert page.count('<tr class="refused">') == 2 and page.count('<tr class="promoted">') == 2


# --------------------------------------------------------------------------- reading and writing files


def test_build_report_facts_reads_a_runs_files_and_write_report_writes_both(tmp_path):
    facts = sample_facts()
    model, data = tmp_path / "model", tmp_path / "data"
    model.mkdir()
    data.mkdir()
    (model / "model.json").write_text(json.dumps(facts.model_card.to_json()))
    (tmp_path / "metrics.json").write_text(json.dumps(facts.metrics.to_json()))
    (data / "manifest.json").write_text(json.dumps(facts.manifest.to_json()))
    (tmp_path / "check.md").write_text("# Data check: `x`\n\n**No anomalies.**\n")

    gathered = build_report_facts(
        model_uri=str(model),
        metrics_uri=str(tmp_path),
        dataset_uri=str(data),
        registry=None,
        policy=PromotionPolicy(max_class_drop=0.1),
        data_check=str(tmp_path / "check.md"),
        history=history(),
    )
    assert gathered.decision == Decision(True, "no champion yet", "no-champion")  # no registry: no champion
    assert gathered.data_check_markdown == "# Data check: `x`\n\n**No anomalies.**\n"
    page, markdown = write_report(
        gathered, str(tmp_path / "out/report.html"), str(tmp_path / "out/report.md")
    )
    assert (tmp_path / "out/report.html").read_text() == page
    assert (tmp_path / "out/report.md").read_text() == markdown
    assert "The candidate wins and may be promoted: no champion yet." in page

    outcome = PromotionOutcome(
        promoted=True, version=1, reason="no champion yet", code="no-champion", previous_version=None
    )
    promoted = build_report_facts(
        model_uri=str(model),
        metrics_uri=str(tmp_path / "metrics.json"),
        dataset_uri=str(data),
        registry=None,
        policy=PromotionPolicy(),
        outcome=outcome,
    )
    assert (
        promoted.decision == Decision(True, "no champion yet", "no-champion") and promoted.outcome == outcome
    )


@pytest.mark.parametrize(
    "promoted_at, title, sentence",
    [
        (
            "2025-11-20T11:05:00Z",  # after this evaluation: this run's promote step moved the pointer
            "Promoted as version 3",
            "the candidate is now champion version 3 (replacing version 2): candidate top1 0.8000 beats",
        ),
        (
            "2025-11-19T09:00:00Z",  # before it: an earlier run promoted these very weights
            "Already the champion",
            "Nothing to promote: the candidate is already the champion (version 3).",
        ),
    ],
)
def test_a_candidate_that_is_the_champion_now_was_promoted_by_this_run_or_before(
    tmp_path, promoted_at, title, sentence
):
    facts = sample_facts()
    metrics = replace(facts.metrics, candidate=replace(facts.metrics.candidate, model_sha256="c0ffee"))
    (tmp_path / "model").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "registry").mkdir()
    (tmp_path / "model/model.json").write_text(json.dumps(facts.model_card.to_json()))
    (tmp_path / "metrics.json").write_text(json.dumps(metrics.to_json()))
    (tmp_path / "data/manifest.json").write_text(json.dumps(facts.manifest.to_json()))
    pointer = {"version": 3, "model_sha256": "c0ffee", "previous_version": 2, "promoted": promoted_at}
    (tmp_path / "registry/champion.json").write_text(json.dumps(pointer))
    events = history() + [
        {
            "time": "2025-11-20T11:05:00Z",
            "event": "promoted",
            "version": 3,
            "candidate": "/runs/7/model",
            "dataset_digest": "ab" * 32,
            "metric": "top1",
            "value": 0.8,
            "reason": "candidate top1 0.8000 beats champion 0.7625 by +0.0375",
            "champion_version": 2,
        }
    ]
    gathered = build_report_facts(
        model_uri=str(tmp_path / "model"),
        metrics_uri=str(tmp_path / "metrics.json"),
        dataset_uri=str(tmp_path / "data"),
        registry=str(tmp_path / "registry"),
        policy=PromotionPolicy(),
        history=events,
    )
    page, _ = render_report(gathered)
    assert f"<h1>{title}</h1>" in page
    assert sentence in page
    # the history's event predates codes: a promotion over a champion is a win
    assert gathered.decision.code == ("wins" if gathered.decision.promote else "already-champion")


def write_run_files(tmp_path, facts: ReportFacts) -> dict[str, str]:
    """The run's model.json, metrics.json and manifest as the train, evaluate and shards steps leave them;
    returns ``write_run_report``'s arguments for them, the outputs under ``out/``."""
    for folder in ("model", "data"):
        (tmp_path / folder).mkdir()
    (tmp_path / "model/model.json").write_text(json.dumps(facts.model_card.to_json()))
    (tmp_path / "metrics.json").write_text(json.dumps(facts.metrics.to_json()))
    (tmp_path / "data/manifest.json").write_text(json.dumps(facts.manifest.to_json()))
    return {
        "html_uri": str(tmp_path / "out/report.html"),
        "markdown_uri": str(tmp_path / "out/report.md"),
        "model_uri": str(tmp_path / "model"),
        "metrics_uri": str(tmp_path / "metrics.json"),
        "dataset_uri": str(tmp_path / "data"),
    }


def promoted_event(version: int, previous: int | None, time: str, value: float) -> dict[str, Any]:
    """A "promoted" event as ``tpustream.release.promote`` logs it (the pointer trimmed to what history reads)."""
    return {
        "event": "promoted",
        "promoted": True,
        "version": version,
        "reason": "no champion yet" if previous is None else f"candidate top1 {value:.4f} beats champion",
        "previous_version": previous,
        "candidate": f"gs://bucket/runs/{version}/model",
        "pointer": {"version": version, "dataset_digest": "ab" * 32, "metrics": {"top1": value}},
        "metric": "top1",
        "value": value,
        "champion_value": None,
        "dataset_digest": "ab" * 32,
        "dataset": "gs://bucket/data/ab12",
        "metrics_uri": f"gs://bucket/runs/{version}/metrics.json",
        "time": time,
    }


def test_write_run_report_shows_the_registrys_history_and_the_promote_steps_outcome(tmp_path, caplog):
    paths = write_run_files(tmp_path, sample_facts())
    events = tmp_path / "registry/events"
    events.mkdir(parents=True)
    (events / "20251101T080000-0a1b2c3d4e5f.json").write_text(
        json.dumps(promoted_event(1, None, "2025-11-01T08:00:00.000000Z", 0.7))
    )
    (events / "20251120T110500-5f4e3d2c1b0a.json").write_text(
        json.dumps(promoted_event(2, 1, "2025-11-20T11:05:00.000000Z", 0.8))
    )
    outcome = (
        PromotionOutcome(  # what tpustream.release.promote.promote returns for this run: the second event
            promoted=True,
            version=2,
            reason="candidate top1 0.8000 beats champion 0.7625 by +0.0375",
            code="wins",
            previous_version=1,
        )
    )
    with caplog.at_level(logging.INFO, logger="tpustream.report.build"):
        facts = write_run_report(
            **paths,
            registry=str(tmp_path / "registry"),
            policy=PromotionPolicy(),
            outcome=outcome,
        )

    assert facts.decision == Decision(True, outcome.reason, "wins")
    assert f"run report: {paths['html_uri']}" in caplog.messages
    page = (tmp_path / "out/report.html").read_text()
    markdown = (tmp_path / "out/report.md").read_text()
    assert (page, markdown) == render_report(facts)
    history_section = page.split('<section id="history">', 1)[1].split("</section>", 1)[0]
    versions = re.findall(
        r'<tr class="promoted"><td>[^<]*</td><td>promoted</td><td>(\d+)</td>', history_section
    )
    assert versions == ["2", "1"]  # newest first
    assert "# Run report: Promoted as version 2" in markdown
    assert (
        "Promoted: the candidate is now champion version 2 (replacing version 1): candidate top1 0.8000 beats "
        "champion 0.7625 by +0.0375." in markdown
    )
    assert [row[2] for row in table_rows(markdown, "## Champion history")] == ["2", "1"]
    assert '<section id="data-check">' not in page  # no data check given


def test_write_run_report_without_a_registry_yet_has_no_history_and_no_missing_data_check(tmp_path):
    paths = write_run_files(tmp_path, sample_facts())
    facts = write_run_report(
        **paths,
        registry=str(tmp_path / "no-registry-yet"),  # the first run: promote has not created it
        policy=PromotionPolicy(max_class_drop=0.1),
        data_check=str(tmp_path / "check-data-did-not-run.md"),
    )
    assert facts.history is None and facts.data_check_markdown is None
    assert facts.decision == Decision(True, "no champion yet", "no-champion")
    page = (tmp_path / "out/report.html").read_text()
    markdown = (tmp_path / "out/report.md").read_text()
    assert "The candidate wins and may be promoted: no champion yet." in page
    assert '<section id="history">' not in page and "## Champion history" not in markdown
    assert '<section id="data-check">' not in page and "## Data check" not in markdown


def test_missing_metrics_are_a_report_error(tmp_path):
    (tmp_path / "model.json").write_text(
        json.dumps({"arch": "resnet18", "classes": CLASSES, "input_size": 32})
    )
    with pytest.raises(ReportError, match="run `tpustream evaluate` first"):
        build_report_facts(
            model_uri=str(tmp_path),
            metrics_uri=str(tmp_path / "nowhere"),
            dataset_uri=str(tmp_path),
            registry=None,
            policy=PromotionPolicy(),
        )


def test_importing_the_report_module_loads_no_torch():
    """The CLI imports it: its --help stays torch-free (matplotlib, the plots' only heavy import, is no torch)."""
    code = "import sys, tpustream.report.build; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_xla')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    assert report.__all__ == [
        "ReportError",
        "ReportFacts",
        "build_report_facts",
        "render_report",
        "write_report",
        "write_run_report",
    ]


def test_the_report_command_writes_the_page_and_the_summary_and_says_the_decision(tmp_path):
    from typer.testing import CliRunner

    from tpustream.cli.main import app

    facts = sample_facts()
    runner = CliRunner()
    args = ["report", "--output", str(tmp_path / "reports"), "--max-class-drop", "0.1"]
    # metrics.json with a champion's numbers: the decision needs that champion's registry
    (tmp_path / "with-champion").mkdir()
    paths = write_run_files(tmp_path / "with-champion", facts)
    args_champion = [*args, "--model", paths["model_uri"], "--metrics", paths["metrics_uri"]]
    refused = runner.invoke(app, [*args_champion, "--data", paths["dataset_uri"]])
    assert refused.exit_code == 2 and "give --registry" in refused.output
    # the first model of all: no champion, no registry yet
    paths = write_run_files(tmp_path, replace(facts, metrics=replace(facts.metrics, champion=None)))
    args += ["--model", paths["model_uri"], "--metrics", paths["metrics_uri"], "--data", paths["dataset_uri"]]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    page = tmp_path / "reports/report.html"
    assert f"report: {page}" in result.output.splitlines()
    assert result.output.startswith("decision: promote (no champion yet)")
    assert "no champion yet" in page.read_text()
    assert "# Run report" in (tmp_path / "reports/report.md").read_text()
    missing = runner.invoke(
        app, ["report", "--model", "m", "--metrics", str(tmp_path / "nowhere"), "--output", "o"]
    )
    assert missing.exit_code == 2 and "does not exist: run tpustream evaluate first" in missing.output
    (tmp_path / "bad.json").write_text('{"format": "tpustream.metrics/v9", "candidate": {}}')
    bad = runner.invoke(
        app, ["report", "--model", "m", "--metrics", str(tmp_path / "bad.json"), "--output", "o"]
    )
    assert bad.exit_code == 2 and "--metrics:" in bad.output and "tpustream.metrics/v9" in bad.output, (
        bad.output
    )


def test_the_history_shows_each_decisions_champion_on_its_data_and_says_when_data_differ():
    """Issue 34: v1 72% -> v2 87% on one axis looked like +15 points while the decision compared both models on
    its own data; the plot marks the champion measured on each decision's data, and the caption says the
    decisions' data differ when their manifest digests do."""
    from tpustream.report.plots import history_on_different_data, history_svg

    events = history(4)
    for n, event in enumerate(events):
        event["champion_value"] = None if n == 0 else 0.5 + 0.01 * n
    plain = history_svg([{**e, "champion_value": None} for e in events], "top1", True)
    paired = history_svg(events, "top1", True)
    assert "champion then, same data" in paired and "champion then, same data" not in plain
    same_data_page, _ = render_report(sample_facts(history=events))
    assert not history_on_different_data(events)
    assert "measured on different data" not in same_data_page
    events[2]["dataset_digest"] = "cd" * 32
    assert history_on_different_data(events)
    different_page, _ = render_report(sample_facts(history=events))
    assert "measured on different data" in different_page


def test_the_training_section_names_pretrained_weights_and_each_epochs_samples():
    rows = [{**row, "train_samples_seen": 1000 - n, "train_samples_left_out": n, "train_samples_repeated": 0}
            for n, row in enumerate(epochs(2))]  # fmt: skip
    pretrained = {"spec": "resnet18.IMAGENET1K_V1", "uri": "gs://b/cache/resnet18-f37072fd.pth",
                  "name": "resnet18.IMAGENET1K_V1", "sha256": "f37072fd" + "0" * 56}  # fmt: skip
    card = _card({"arch": "resnet18", "classes": CLASSES, "history": rows, "pretrained": pretrained})
    page, _ = render_report(sample_facts(model_card=card))
    training = page.split('<section id="training">', 1)[1].split("</section>", 1)[0]
    assert (
        "fine-tuned from pretrained weights <code>resnet18.IMAGENET1K_V1</code> (sha256 f37072fd0000"
        in training
    )
    assert "train samples seen / left out / repeated" in training and "<td>999 / 1 / 0</td>" in training
    old, _ = render_report(sample_facts())  # a card written before: no column, random initialisation
    assert "train samples seen" not in old and "random initialisation" in old


def test_precision_recall_and_thresholds_are_shown_when_evaluate_measured_them():
    facts = sample_facts()
    thresholds = [{"threshold": t / 100, "precision": 0.8 + t / 500, "recall": 0.8 - t / 200,
                   "coverage": 1 - t / 150, "f1": 0.7} for t in range(100)]  # fmt: skip
    per_class = {"precision": [0.9, 0.5, 0.8, 0.7], "recall": [0.95, 0.6, None, 0.8],
                 "f1": [0.92, 0.545, None, 0.747], "support": [20, 20, 0, 20], "predicted": [21, 24, 0, 23],
                 "auprc": [0.97, 0.6, None, 0.8]}  # fmt: skip
    candidate = replace(
        facts.metrics.candidate,
        per_class=per_class,
        thresholds=thresholds,
        macro_f1=0.7373,
        balanced_accuracy=0.7833,
        auprc=0.81,
    )
    page, _ = render_report(replace(facts, metrics=replace(facts.metrics, candidate=candidate)))
    section = page.split('<section id="precision-recall">', 1)[1].split("</section>", 1)[0]
    assert "Macro-F1 0.7373" in section and "balanced accuracy 78.3%" in section
    # worst F1 first, the unmeasured class last, names escaped
    names = re.findall(r"<tr[^>]*><td>([^<]*)</td><td>[\d.]+%|<tr[^>]*><td>([^<]*)</td><td>not", section)
    assert [a or b for a, b in names][:4] == [
        "dog",
        "bird &amp; fish",
        "cat",
        "&lt;script&gt;alert(1)&lt;/script&gt;",
    ]
    assert section.count("<tr") - 2 == 4 + 7  # two header rows; 4 classes and 7 thresholds
    assert "<td>0.90</td>" in section and '<figure id="plot-thresholds">' in section
    assert (
        '<section id="precision-recall">' not in render_report(facts)[0]
    )  # no per-sample scores: no section


def test_a_decision_on_macro_f1_shows_it_beside_top1_as_a_score():
    """The decision table gains macro-F1 and balanced accuracy when evaluate measured them; an F1 is a score
    (0.7000), balanced accuracy a share of samples (a percentage)."""
    facts = sample_facts()
    candidate = replace(facts.metrics.candidate, macro_f1=0.7, balanced_accuracy=0.75)
    assert facts.metrics.champion is not None
    champion = replace(facts.metrics.champion, macro_f1=0.65, balanced_accuracy=0.7)
    metrics = replace(facts.metrics, candidate=candidate, champion=champion)
    _, summary = render_report(
        replace(facts, metrics=metrics, policy=replace(facts.policy, metric="macro_f1"))
    )
    assert re.search(r"macro-F1 \(decides\) \| 0\.7000 \| 0\.6500 \| \+0\.0500", summary), summary
    assert re.search(r"balanced accuracy \| 75\.00% \| 70\.00% \| \+5\.00 points", summary)
    assert "macro-F1" not in render_report(facts)[1]  # an evaluation before them: no rows


def test_the_report_names_the_split_that_decides():
    page, markdown = render_report(sample_facts())
    assert (
        "on the val split" in markdown and table_rows(markdown, "Policy: decide on")[-1][0] == "val samples"
    )
    on_test = replace(sample_facts().metrics, split="test")
    page, markdown = render_report(sample_facts(metrics=on_test))
    assert "Policy: decide on top1 (higher is better) on the test split" in markdown
    assert table_rows(markdown, "Policy: decide on")[-1][0] == "test samples"
    assert "the share of the true class&#x27;s test samples" in page  # the confusion matrix's note


# --------------------------------------------------------------------------- issue 42: what the report shows


def test_every_per_class_caption_and_axis_names_the_deciding_split():
    """Issue 42: the per-class chart's axis read "accuracy on the class's val samples" over test numbers."""
    from tpustream.report.plots import per_class_figure

    figure = per_class_figure(["a", "b"], [0.5, 1.0], None, [False, False], split="test")
    assert figure.axes[0].get_xlabel() == "accuracy on the class's test samples"
    on_test = replace(sample_facts().metrics, split="test")
    page, markdown = render_report(sample_facts(metrics=on_test))
    per_class = page.split('<section id="per-class">', 1)[1].split("</section>", 1)[0]
    assert "Accuracy on each class&#x27;s test samples." in per_class
    assert 'alt="per-class accuracy on the test split, candidate and champion"' in per_class
    assert "<th>candidate (test)</th>" in per_class and "<th>test samples</th>" in per_class
    assert 'alt="candidate confusion matrix on the test split"' in page
    assert "Accuracy on each class's test samples." in markdown
    assert " val " not in per_class.replace("val_", "")  # nothing there is on val


def test_a_class_too_small_to_judge_is_marked_and_its_drop_does_not_refuse():
    """Issue 42: a class with 2 test samples showed a +100-point drop with no caveat. Under the policy's
    min_class_support it is marked "n=2, too few to judge", not beyond max_class_drop, and the decision (the
    policy's own) promotes; min_class_support 0 makes it decide again."""
    facts = sample_facts()
    candidate = replace(
        facts.metrics.candidate,
        per_class_accuracy=[0.95, 0.0, 0.85, 0.8],
        confusion_matrix=[[19, 1, 0, 0], [2, 0, 0, 0], [0, 0, 17, 3], [4, 0, 0, 16]],
    )
    metrics = replace(facts.metrics, candidate=candidate)
    policy = facts.policy  # max_class_drop 0.1, min_class_support 10
    decision = decide(candidate, metrics.champion, candidate_digest="d", champion_digest="d", policy=policy)
    assert decision.promote and "class 1 (n=2) by 0.9000" in decision.reason
    page, markdown = render_report(replace(facts, metrics=metrics, decision=decision))
    assert '<tr class="few"><td>dog</td><td>0.0%</td><td>90.0%</td><td>+90.0</td><td></td>' in page
    assert "<td>n=2, too few to judge</td>" in page and 'class="exceeds"' not in page
    assert "1 class has fewer than 10 val samples (min_class_support): too few to judge" in page
    assert table_rows(markdown, "## Per-class accuracy")[0] == [
        "dog",
        "0.0%",
        "90.0%",
        "+90.0",
        "",
        "n=2, too few to judge",
    ]
    strict = replace(policy, min_class_support=0)
    decision = decide(candidate, metrics.champion, candidate_digest="d", champion_digest="d", policy=strict)
    assert not decision.promote
    page, _ = render_report(replace(facts, metrics=metrics, decision=decision, policy=strict))
    assert re.findall(r'<tr class="exceeds"><td>(.*?)</td>', page) == ["dog"]
    assert "Refused, the champion stays: class “dog” accuracy drops by 90.0 points" in page


def test_precision_at_zero_coverage_reads_not_applicable():
    """Issue 42: the threshold table showed precision 100.0% at 0.0% coverage, a share of no predictions."""
    facts = sample_facts()
    thresholds = [
        {"threshold": 0.9, "precision": 0.95, "recall": 0.2, "coverage": 0.21},
        {"threshold": 0.99, "precision": 1.0, "recall": 0.0, "coverage": 0.0},
    ]
    candidate = replace(facts.metrics.candidate, per_class={"support": [20] * 4}, thresholds=thresholds)
    page, _ = render_report(replace(facts, metrics=replace(facts.metrics, candidate=candidate)))
    assert "<tr><td>0.99</td><td>n/a</td><td>0.0%</td><td>0.0%</td></tr>" in page
    assert "<tr><td>0.90</td><td>95.0%</td><td>20.0%</td><td>21.0%</td></tr>" in page


def _recipe(page: str) -> dict[str, str]:
    section = page.split('<section id="recipe">', 1)[1].split("</section>", 1)[0]
    return dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", section))


def test_the_training_recipe_section_says_how_the_candidate_was_trained():
    """Issue 42: the report did not show the LR, the schedule, freezing, class weights or the weights' source."""
    training = {"epochs": 6, "batch_size": 32, "global_batch_size": None, "lr": None, "warmup_epochs": 1.0,
                "freeze_epochs": 2, "backbone_lr_scale": 0.5, "class_weights": "auto", "bf16": True,
                "label_smoothing": 0.1, "momentum": 0.9, "weight_decay": None, "patience": 0}  # fmt: skip
    rows = [{**row, "samples_per_s": 640.0, "samples_per_s_per_device": 160.0} for row in epochs(3)]
    pretrained = {"spec": "gs://b/resnet18.pth", "uri": "gs://b/resnet18.pth", "name": "resnet18.pth",
                  "sha256": "ab" * 32, "head": "fc", "tensors_loaded": 120}  # fmt: skip
    card = _card(
        {
            "arch": "resnet18",
            "classes": CLASSES,
            "history": rows,
            "metrics": {"epoch": 3},
            "training": training,
            "pretrained": pretrained,
            "class_weights": {"cat": 0.5, "dog": 2.0},
            "head_lr_scale": 10.0,
        }
    )
    page, markdown = render_report(sample_facts(model_card=card))
    recipe = _recipe(page)
    # 4 devices (640 / 160 samples/s) x 32: global batch 128, sqrt-scaled 0.1 -> 0.07071, times resnet18's
    # fine-tuning factor
    factor = model_spec("resnet18").fine_tune_lr_factor
    assert recipe["peak LR"] == (
        f"{0.07071 * factor:.4g}: fine-tuning&#x27;s {factor:g}x the scaled default 0.07071 (0.1 at a global "
        "batch of 256, scaled to 128; no --lr given)"
    )
    assert recipe["schedule"] == (
        "linear warmup over 1 epoch to the peak, then cosine decay to 0 at the end of epoch 6, per step"
    )
    assert recipe["epochs"].startswith("6 planned, 3 trained")
    assert recipe["freeze epochs"] == "2: the head alone for the first 2 epochs, then every layer"
    assert recipe["backbone LR scale"].startswith("0.5: the backbone at 0.5 of the scheduled LR")
    assert recipe["head LR scale"] == (
        "10: the head at 10x the scheduled LR, the model&#x27;s rule for the new head of a run from --pretrained "
        "weights"
    )
    assert _recipe(render_report(sample_facts(model_card=replace(card, extra={})))[0])["head LR scale"] == (
        "not recorded"  # a card written before the head's multiple was
    )
    given = replace(card, training={**training, "head_lr_scale": 1.0}, extra={"head_lr_scale": 1.0})
    assert _recipe(render_report(sample_facts(model_card=given))[0])["head LR scale"] == (
        "1: the head at the scheduled LR, given with --head-lr-scale"
    )
    assert recipe["class weights"] == "auto: inverse class frequency in the train split: cat 0.5, dog 2"
    assert recipe["precision"] == "bf16 autocast"
    assert recipe["augmentation"].startswith("train: a random crop of 35% to 100% of the image")
    assert recipe["pretrained weights"] == (
        f"resnet18.pth from gs://b/resnet18.pth, sha256 {'ab' * 32}, 120 backbone tensors loaded; the head is new"
    )
    assert recipe["warm start"] == "none"
    assert "## Training recipe" in markdown and f"sha256 {'ab' * 32}" in markdown

    warm = {"from": "gs://b/registry", "resolved": "gs://b/registry/versions/1/model", "kind": "champion",
            "weights": "all", "head_rows_kept": 4, "new_classes": [], "gone_classes": [],
            "peak_lr": 0.0035}  # fmt: skip
    started = replace(card, pretrained=None, init=warm)
    recipe = _recipe(render_report(sample_facts(model_card=started))[0])
    assert recipe["peak LR"].startswith("0.0035: the warm start&#x27;s, a tenth of the scaled default")
    assert recipe["warm start"] == (
        "from gs://b/registry (gs://b/registry/versions/1/model), a champion: all weights"
    )
    given = replace(card, training={**training, "lr": 0.2, "bf16": False, "freeze_epochs": 0})
    recipe = _recipe(render_report(sample_facts(model_card=given))[0])
    assert recipe["peak LR"] == "0.2, given with --lr" and recipe["precision"] == "fp32"
    scratch = replace(card, pretrained=None, training={**training, "freeze_epochs": 0})
    recipe = _recipe(render_report(sample_facts(model_card=scratch))[0])
    assert recipe["peak LR"].startswith("0.07071: the default, 0.1 at a global batch of 256 scaled to 128")
    old = _recipe(render_report(sample_facts())[0])  # a card with no training record
    assert old["peak LR"] == "not recorded" and old["warm start"] == "none"


def test_the_recipe_rows_show_the_chosen_recipe_its_policies_the_ema_and_layer_decay():
    """Issue 46: model.json's recipe (the name chosen and why, its values, whose weights model.pt holds)."""
    recipe = {"name": "vit-finetune", "why": "a ViT (vit_b_16) from trained weights", "augment": "randaugment",
              "random_erasing": 0.25, "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "ema_decay": 0.9999,
              "layer_decay": 0.65, "overridden": ["ema_decay"], "model_weights": "ema"}  # fmt: skip
    card = _card({"arch": "vit_b_16", "classes": CLASSES, "history": epochs(2), "recipe": recipe})
    rows = _recipe(render_report(sample_facts(model_card=card))[0])
    assert rows["recipe"] == "vit-finetune: a ViT (vit_b_16) from trained weights; given: ema_decay"
    train = rows["augmentation"].split("; evaluation")[0]
    assert train.endswith(
        "then RandAugment (2 ops, magnitude 9) (torchvision.transforms.v2), then random erasing of a patch "
        "with probability 0.25"
    )
    assert rows["MixUp / CutMix"] == (
        "MixUp alpha 0.8 and CutMix alpha 1, each step one or the other, half the time each: soft targets, in "
        "the compiled step"
    )
    assert rows["weight average (EMA)"] == (
        "decay 0.9999 per step (with warmup), evaluated each epoch; the model is the EMA&#x27;s (better val top-1)"
    )
    assert rows["layer-wise LR decay"].startswith("0.65: each transformer block at 0.65 of the LR")
    plain = {**recipe, "name": "plain", "augment": "none", "random_erasing": 0.0, "mixup_alpha": 0.0,
             "cutmix_alpha": 0.0, "ema_decay": 0.0, "layer_decay": 1.0, "model_weights": "raw"}  # fmt: skip
    rows = _recipe(render_report(sample_facts(model_card=replace(card, recipe=plain)))[0])
    assert (rows["MixUp / CutMix"], rows["weight average (EMA)"], rows["layer-wise LR decay"]) == (
        "none",
        "none",
        "none",
    )
    assert "then" not in rows["augmentation"]
    old = _recipe(render_report(sample_facts())[0])  # a card written before the recipe was recorded
    assert old["recipe"] == old["MixUp / CutMix"] == old["weight average (EMA)"] == "not recorded"


def test_a_banner_says_when_the_loss_rose_by_an_order_of_magnitude_or_went_non_finite():
    """Issue 42: a run whose train loss went 3.06 -> 28.3 and val loss to 18,303 was promoted with no word."""
    losses = [(3.06, 2.9), (2.5, 40.0), (28.3, 18303.0)]
    rows = [{**row, "train_loss": t, "val_loss": v} for row, (t, v) in zip(epochs(3), losses, strict=True)]
    card = _card({"arch": "resnet18", "classes": CLASSES, "history": rows})
    page, markdown = render_report(sample_facts(model_card=card))
    banner = re.search(r'<p class="alarm" id="loss-alarm">([^<]*)</p>', page)
    assert banner is not None
    assert (
        "Training diverged: train loss rose from 3.06 in epoch 1, lowest 2.5 in epoch 2, to 28.3 in epoch 3, "
        "more than 10x its lowest; val loss rose from 2.9 in epoch 1 to 1.83e+04 in epoch 3"
    ) in banner.group(1)
    assert "> **Warning:** Training diverged: train loss rose from 3.06" in markdown
    nan_rows = [*epochs(2), {**epochs(3)[2], "val_loss": math.nan}]
    page, _ = render_report(sample_facts(model_card=replace(card, history=nan_rows)))
    assert "val loss is not a finite number in epoch 3 (nan)" in page
    calm, summary = render_report(sample_facts())  # 2.0 -> 0.67: no banner
    assert 'id="loss-alarm"' not in calm and "Warning" not in summary


def test_the_recipe_states_the_peak_lr_the_trainer_recorded():
    """A card since issue 42 records the peak LR and global batch the trainer chose: the report shows them,
    not a reconstruction from throughput."""
    training = {"epochs": 2, "batch_size": 8, "global_batch_size": None, "lr": None, "warmup_epochs": 1.0}
    pretrained = {"spec": "gs://b/r.pth", "uri": "gs://b/r.pth", "name": "r.pth", "sha256": "cd" * 32}
    card = _card(
        {"arch": "resnet18", "classes": CLASSES, "history": epochs(2), "metrics": {"epoch": 2},
         "training": training, "pretrained": pretrained, "peak_lr": 0.0123, "global_batch": 32}
    )  # fmt: skip
    assert card.peak_lr == 0.0123 and card.global_batch == 32
    recipe = _recipe(render_report(sample_facts(model_card=card))[0])
    assert recipe["peak LR"] == (
        "0.0123: fine-tuning&#x27;s default, its family&#x27;s factor times the scaled default at a global batch of 32 "
        "(no --lr given)"
    )


def test_the_majority_class_baseline_is_shown_beside_the_candidate():
    from tpustream.artifacts import Baseline

    facts = sample_facts()
    page, markdown = render_report(facts)
    assert "Majority-class baseline" not in page + markdown  # an evaluation before the baseline
    with_baseline = replace(facts.metrics, baseline=Baseline(answer="cat <b>", top1=0.394, macro_f1=0.14))
    page, markdown = render_report(replace(facts, metrics=with_baseline))
    line = (
        "Majority-class baseline: always answering “cat &lt;b&gt;” (the train split's most frequent class) "
        "scores top1 39.40% on the val split, the candidate 80.00%: the candidate must beat it."
    )
    assert line in markdown  # the user's class name escaped (the KFP UI renders HTML in Markdown)
    assert '<p class="note baseline">' + line.replace("'", "&#x27;") in page
    off = replace(facts, metrics=with_baseline, policy=PromotionPolicy(beat_majority_baseline=False))
    assert "not required (beat_majority_baseline off)" in render_report(off)[0]
