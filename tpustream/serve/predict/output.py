"""``tpustream predict --output``: predict into resumable parts (``parts``), keeping the ones an interrupted run
completed, and write ``_SUCCESS`` last."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

from tpustream.serve.predict.config import PredictConfig, PredictError
from tpustream.serve.predict.inputs import Skipped, planned_items
from tpustream.serve.predict.parts import (
    SUCCESS,
    OutputParts,
    PartEntry,
    PartRequest,
    PredictionSummary,
    differences,
    existing_output,
    part_name,
    read_summary,
    recorded_parts,
    remove_stale,
)
from tpustream.serve.predict.pool import device_for_cli, predict_items, say_top_k_cap
from tpustream.storage import io as storage

__all__ = ["predict_to_output"]


def predict_to_output(config: PredictConfig, *, progress: bool = False) -> tuple[PredictionSummary, bool]:
    """Predict into ``config.output`` (JSON lines in parts, then ``_SUCCESS``), keeping the parts an
    interrupted run completed.

    Returns:
        The output's summary, and whether this run wrote it (False: the output was already complete for the
        same request, and nothing was done).

    Raises:
        PredictError: the output holds other files, or another request's complete output (without
            ``overwrite``).
    """
    from tqdm import tqdm

    from tpustream.serve.classifier import Classifier, resolve_model_uri

    assert config.output, "predict_to_output needs config.output"
    output = storage.absolute(config.output)
    limits = config.limits()
    model_uri = resolve_model_uri(config.model)
    request = config.request(model_uri)
    existing = existing_output(output)
    if SUCCESS in existing:
        complete = read_summary(output)
        if complete is None:
            raise PredictError(
                f"{output}/{SUCCESS} is not a tpustream predictions summary: choose another --output"
            )
        if not config.overwrite:
            if complete.request == request:
                return complete, False
            raise PredictError(
                f"{output} already holds the complete predictions of another request "
                f"({differences(complete.request, request)}): pass --overwrite to replace them, "
                "or choose another --output"
            )
        storage.delete(storage.join(output, SUCCESS))  # partial from here until the new _SUCCESS
    classifier = Classifier(model_uri, limits=limits, device=device_for_cli())
    say_top_k_cap(config.top_k, classifier)
    started = time.perf_counter()  # the rate: listing, reading, decoding, classifying and writing
    part_request = PartRequest(
        model=classifier.uri,
        model_sha256=classifier.model_sha256,
        top_k=config.top_k,
        max_pixels=limits.max_pixels,
    )
    skipped = Skipped()
    bar = tqdm(desc="predict", unit="img", file=sys.stderr, disable=not progress, delay=1.0)
    parts = OutputParts(
        output,
        part_request,
        existing,
        resumable=set() if config.overwrite else recorded_parts(existing),
        part_size=config.part_size,
        on_part=lambda parts: bar.set_postfix(parts=parts.written, kept=len(parts.kept), refresh=False),
    )
    predictions = predict_items(
        classifier,
        parts.feed(planned_items(config, classifier.uri, skipped)),
        top_k=config.top_k,
        batch_size=limits.batch_size,
        workers=config.workers,
    )
    try:
        for result in predictions:
            bar.update()
            parts.take(result)
    finally:
        predictions.close()  # stops the decode workers now, also when interrupted
        bar.close()
    remove_stale(output, existing, num_parts=len(parts.records))
    ordered = parts.ordered()
    for record in ordered:
        for reason, count in record.skipped.items():
            skipped.counts[reason] = skipped.counts.get(reason, 0) + count
    summary = PredictionSummary(
        output=output,
        request=request,
        answered=sum(record.answered for record in ordered),
        known=sum(record.known for record in ordered),
        correct=sum(record.correct for record in ordered),
        failed=sum(record.num_results - record.answered for record in ordered),
        skipped=dict(sorted(skipped.counts.items())),
        skipped_examples=skipped.examples,
        parts=[
            PartEntry(path=part_name(record.index), num_results=record.num_results, sha256=record.sha256)
            for record in ordered
        ],
        model_sha256=classifier.model_sha256,
        kept_parts=len(parts.kept),
        predicted=sum(
            record.num_results for index, record in parts.records.items() if index not in parts.kept
        ),
        seconds=round(time.perf_counter() - started, 3),
    )
    summary_json = json.dumps(asdict(summary), indent=1).encode()
    storage.write_bytes(storage.join(output, SUCCESS), summary_json, content_type="application/json")
    return summary, True
