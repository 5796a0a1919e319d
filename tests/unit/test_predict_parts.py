"""tpustream/serve/predict/parts.py: the parts of a ``predict --output`` run, fed and taken in one order, written
with their records, and kept by a re-run of the same request (local storage: the order is storage-free)."""

import itertools
import json
from collections import deque

from tpustream.serve.predict.inputs import Item
from tpustream.serve.predict.parts import OutputParts, PartRequest, existing_output, recorded_parts

REQUEST = PartRequest(model="/m", model_sha256="ab" * 32, top_k=1, max_pixels=1 << 24)


def _items(versions="vvvvv"):
    return [Item(f"img{index}.png", b"", version=version) for index, version in enumerate(versions)]


def _result(item):
    return {"input": item.name, "classes": ["cat"], "class_indices": [0], "probabilities": [1.0]}


def _run(output, items, *, existing=None, request=REQUEST, read_ahead=3):
    """One run as predict_to_output drives it: the pool pulls ``read_ahead`` items before the first result."""
    existing = existing if existing is not None else {}
    parts = OutputParts(output, request, existing, resumable=recorded_parts(existing), part_size=2)
    fed = parts.feed(iter(items))
    ahead = deque(itertools.islice(fed, read_ahead))
    taken = []
    while ahead:
        item = ahead.popleft()
        parts.take(_result(item))
        taken.append(item.name)
        ahead.extend(itertools.islice(fed, 1))
    return parts, taken


def test_each_result_lands_in_its_part_and_a_part_is_written_when_complete(tmp_path):
    output = str(tmp_path / "out")
    items = _items()
    parts, taken = _run(output, items)
    assert taken == [item.name for item in items]
    assert [(record.index, record.num_results) for record in parts.ordered()] == [(0, 2), (1, 2), (2, 1)]
    assert parts.written == 3 and parts.kept == set()
    for record in parts.ordered():
        lines = (tmp_path / "out" / f"predictions-{record.index:05d}.jsonl").read_text().splitlines()
        names = [json.loads(line)["input"] for line in lines]
        assert names == [item.name for item in items[2 * record.index : 2 * record.index + 2]]
    # one item read ahead of its result, or all of them: the same parts
    again, _ = _run(str(tmp_path / "alone"), items, read_ahead=1)
    assert [record.sha256 for record in again.ordered()] == [record.sha256 for record in parts.ordered()]


def test_a_rerun_keeps_the_parts_of_the_same_request_and_feeds_only_the_others(tmp_path):
    output = str(tmp_path / "out")
    _run(output, _items())
    kept, taken = _run(output, _items(), existing=existing_output(output))
    assert taken == [] and kept.kept == {0, 1, 2} and kept.written == 0
    changed, taken = _run(output, _items("vvvwv"), existing=existing_output(output))  # img3 changed
    assert taken == ["img2.png", "img3.png"] and changed.kept == {0, 2}
    other = PartRequest(**{**REQUEST, "top_k": 2})
    redone, taken = _run(output, _items("vvvwv"), existing=existing_output(output), request=other)
    assert len(taken) == 5 and redone.kept == set()
