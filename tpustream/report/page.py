"""The run report page's frame: the inline CSS, the Content-Security-Policy, the header stating the decision
with its headline numbers, the contents and the footer (``render_page``); and the elements every section writes
with (``code``, ``figure``, ``note``, ``table``), each escaping what it is given but ``table``, whose cells are
HTML already. The sections themselves are ``tpustream.report.html``'s."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape as _E
from typing import Any

from tpustream.report.facts import ReportFacts
from tpustream.report.formatting import (
    baseline_line,
    champion_heading,
    headline,
    no_champion_text,
    policy_line,
)
from tpustream.report.recipe import loss_alarm
from tpustream.report.verdict import Verdict

__all__ = ["code", "figure", "note", "render_page", "table"]


_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d1d1f;
 max-width:1180px;margin:0 auto;padding:0 24px 48px}
h1{font-size:26px;margin:0 0 6px}h2{margin-top:36px;border-bottom:2px solid #e4e4e4;padding-bottom:4px}
header{margin:20px 0;padding:16px 20px;border-left:8px solid #1f6fb4;background:#eef3fb;border-radius:6px}
header.promoted{border-color:#2e7d32;background:#e8f5e9}header.refused{border-color:#c62828;background:#fdecea}
header .sentence{font-size:17px;margin:4px 0 10px}
table{border-collapse:collapse;margin:10px 0;font-variant-numeric:tabular-nums}
th,td{padding:4px 12px;border-bottom:1px solid #ddd;text-align:right;vertical-align:top}
th{background:#f5f5f7}th:first-child,td:first-child{text-align:left}
table.text td,table.text th,table.events td:nth-child(n+6),table.events th:nth-child(n+6){text-align:left;max-width:460px;overflow-wrap:anywhere}
tr.exceeds td,tr.refused td:nth-child(2){color:#b71c1c;font-weight:600}tr.exceeds{background:#fdecea}
tr.few td{color:#777;font-style:italic}
.alarm{margin:12px 0;padding:10px 16px;border-left:8px solid #c62828;background:#fdecea;font-weight:600}
.better{color:#2e7d32}.worse{color:#c62828}
.note{color:#555}.plots{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
figure{margin:10px 0}figure img{max-width:100%;height:auto;display:block}figcaption{color:#555;font-size:13px}
code{background:#f2f2f4;padding:1px 4px;border-radius:3px;overflow-wrap:anywhere}
nav{background:#fafafa;border:1px solid #e4e4e4;border-radius:6px;padding:6px 16px}nav ol{margin:6px 0}
footer{margin-top:40px;color:#777;font-size:13px}
.mistakes{display:flex;flex-wrap:wrap;gap:10px}figure.mistake{width:150px;margin:0;font-size:12px}
figure.mistake img{width:96px;height:96px;object-fit:contain;image-rendering:pixelated;background:#f5f5f7}
.nopic{width:96px;height:96px;background:#f5f5f7;color:#999;font-size:11px;display:flex;align-items:center;justify-content:center}
.near-pairs{display:flex;flex-wrap:wrap;gap:14px 28px}.near-pair{display:flex;gap:6px;align-items:flex-start}
.near-distance{align-self:center;color:#c62828;font-size:12px;white-space:nowrap}
"""
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def render_page(facts: ReportFacts, verdict: Verdict, sections: list[tuple[str, str, str]]) -> str:
    """The whole page: the header stating ``verdict`` with the headline numbers, the contents, ``sections``
    (key, title, HTML content) in order, the footer."""
    champion_header = _E(champion_heading(facts))
    numbers = table(
        ["", "candidate", champion_header, "change"],
        [
            [_E(a), _E(b), _E(c), f'<span class="{tone}">{_E(d)}</span>' if tone else _E(d)]
            for a, b, c, d, tone in headline(facts)
        ],
    )
    missing = ""
    if facts.champion is None:
        missing = f'<p class="note">No champion numbers: {_E(no_champion_text(facts))}.</p>'
    alarm = loss_alarm(facts.model_card.history)
    banner = f'<p class="alarm" id="loss-alarm">{_E(alarm)}</p>' if alarm else ""
    baseline = f'<p class="note baseline">{_E(line)}</p>' if (line := baseline_line(facts)) else ""
    toc = "".join(f'<li><a href="#{key}">{_E(title)}</a></li>' for key, title, _ in sections)
    body = "".join(
        f'<section id="{key}"><h2>{_E(title)}</h2>{content}</section>' for key, title, content in sections
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>tpustream run report: {_E(verdict.title)}</title><style>{_CSS}</style></head><body>"
        f'<header id="decision" class="{verdict.kind}"><h1>{_E(verdict.title)}</h1>'
        f'<p class="sentence">{_E(verdict.sentence)}</p>{banner}{numbers}{missing}'
        f'<p class="note">{_E(policy_line(facts))}</p>{baseline}</header>'
        f"<nav><strong>Contents</strong><ol>{toc}</ol></nav>{body}"
        f"<footer>tpustream run report. Candidate {code(facts.metrics.candidate.model)}, evaluated "
        f"{_E(facts.metrics.created)} on {code(facts.metrics.dataset.uri)}.</footer>"
        "</body></html>\n"
    )


def code(text: Any) -> str:
    """``text`` as inline code, escaped."""
    return f"<code>{_E(str(text))}</code>"


def figure(plot_id: str, svg: str, alt: str, caption: str = "") -> str:
    """An SVG plot inlined as a ``data:`` image (the page fetches nothing), with its alt text and caption."""
    source = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")
    below = f"<figcaption>{_E(caption)}</figcaption>" if caption else ""
    return f'<figure id="{plot_id}"><img src="{source}" alt="{_E(alt)}">{below}</figure>'


def note(text: str) -> str:
    """A paragraph of explanation, escaped."""
    return f'<p class="note">{_E(text)}</p>'


def table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    row_classes: Sequence[str] | None = None,
    css: str = "",
) -> str:
    """An HTML table from cells that are already HTML (escaped before); ``row_classes``: a CSS class per row."""
    head = "".join(f"<th>{cell}</th>" for cell in header)
    body = []
    for position, row in enumerate(rows):
        row_css = row_classes[position] if row_classes else ""
        attribute = f' class="{row_css}"' if row_css else ""
        body.append(f"<tr{attribute}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    attribute = f' class="{css}"' if css else ""
    return f"<table{attribute}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
