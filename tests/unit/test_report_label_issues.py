"""The run report's likely label errors gallery (tpustream/report/label_issues.py): a figure per issue with its
given and suggested class, names escaped, a sample without a picture still listed, and the section on the page."""

from tests.common.report import EVIL, sample_facts
from tpustream.metrics.label_issues import LabelIssue
from tpustream.report.build import render_report
from tpustream.report.label_issues import LabelErrorsGallery, label_errors_html

JPEG = "data:image/jpeg;base64,/9j/AA=="


def _gallery(total=2, **changes):
    issues = (
        LabelIssue(
            key="00000007", source="raw/7.png", given_class=EVIL, suggested_class="cat", self_confidence=0.012
        ),
        LabelIssue(
            key="00000031", source="", given_class="dog", suggested_class="bird & fish", self_confidence=0.25
        ),
    )
    fields = {
        "split": "test",
        "num_samples": 80,
        "total": total,
        "issues": issues,
        "thumbnails": {"00000007": JPEG},
    }
    return LabelErrorsGallery(**{**fields, **changes})


def test_each_issue_shows_its_picture_given_and_suggested_class_escaped():
    body = label_errors_html(_gallery())
    assert body.count("<figure") == 2 and f'<img src="{JPEG}"' in body
    assert (
        "labelled <b>&lt;script&gt;alert(1)&lt;/script&gt;</b>, looks like <b>cat</b> (1.2% for its label)"
        in body
    )
    assert EVIL not in body and "bird &amp; fish" in body
    assert '<div class="nopic">no picture</div>' in body  # 00000031 has no thumbnail: listed all the same
    assert "<code>raw/7.png</code>" in body and "<code>00000031</code>" in body  # source, else the key
    assert "2 of 80 test samples" in body and "first 2 shown" not in body
    assert "the first 2 shown" in label_errors_html(_gallery(total=9))


def test_a_split_without_issues_says_so():
    assert "No likely label error" in label_errors_html(_gallery(total=0, issues=()))


def test_the_page_has_the_section_only_when_evaluate_listed_them():
    assert '<section id="label-errors">' not in render_report(sample_facts())[0]
    page = render_report(sample_facts(label_errors=_gallery()))[0]
    assert '<section id="label-errors">' in page and "Likely label errors" in page


def test_the_summary_lists_them_with_key_classes_and_score_escaped():
    """The Markdown summary (the KFP UI's Markdown artifact) lists what the page shows: key, source, given
    and suggested class, score; the first 20 with the count."""
    summary = render_report(sample_facts(label_errors=_gallery()))[1]
    section = summary.split("## Likely label errors\n", 1)[1].split("\n## ", 1)[0]
    assert "2 of 80 test samples whose given label the candidate contradicts" in section
    assert "| key | source | given class | suggested class | score (p of given) |" in section
    assert "| 00000007 | raw/7.png | &lt;script&gt;alert(1)&lt;/script&gt; | cat | 0.012 |" in section
    assert "| 00000031 |  | dog | bird &amp; fish | 0.250 |" in section  # no source: the key alone
    assert EVIL not in summary and "listed" not in section
    many = tuple(
        LabelIssue(
            key=f"{i:08d}",
            source=f"raw/{i}.png",
            given_class="dog",
            suggested_class="cat",
            self_confidence=0.01,
        )
        for i in range(30)
    )
    long = render_report(sample_facts(label_errors=_gallery(total=30, issues=many)))[1]
    rows = [
        line for line in long.split("## Likely label errors\n", 1)[1].splitlines() if line.startswith("| 000")
    ]
    assert len(rows) == 20 and "30 of 80 test samples" in long and "the first 20 listed" in long
    none = render_report(sample_facts(label_errors=_gallery(total=0, issues=())))[1]
    assert "## Likely label errors\n\nNo likely label error" in none
    assert "## Likely label errors" not in render_report(sample_facts())[1]


def test_the_data_set_section_says_which_label_fixes_its_manifest_records():
    """A dataset written with exclude_keys/relabel: both documents say what was applied, from the manifest."""
    import dataclasses

    from tests.common.report import CLASSES, manifest
    from tpustream.artifacts import LabelEditsApplied

    edits = LabelEditsApplied(
        exclude_keys="gs://b/drop.txt", relabel=None, excluded=["raw/1.png", "raw/2.png"], relabelled={}
    )
    edited = dataclasses.replace(manifest(CLASSES), label_edits=edits)
    page, summary = render_report(sample_facts(manifest=edited))
    line = "Label fixes applied when it was written: 2 sample(s) left out, 0 relabelled (exclude\\_keys gs://b/drop.txt)."
    assert line in summary.split("## Data set\n", 1)[1].split("\n## ", 1)[0]
    assert "2 sample(s) left out, 0 relabelled (exclude_keys gs://b/drop.txt)" in page
    assert "Label fixes" not in "".join(render_report(sample_facts()))
