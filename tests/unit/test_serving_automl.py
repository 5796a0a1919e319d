"""AutoML's request format, read as aiplatform's schema messages read it: the parameters' JSON and field
names, proto3's 0 for "unset", a protobuf Value's doubles; what the model server answers in its shape."""

import pytest
from google.protobuf import json_format

from tpustream.serve.automl import (
    AutoMLParameters,
    BadRequest,
    automl_prediction,
    field_names,
    parse_automl_parameters,
    request_format,
)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (None, AutoMLParameters(confidence_threshold=0.0, max_predictions=10)),  # the schema's defaults
        ({}, AutoMLParameters()),
        ({"maxPredictions": 0}, AutoMLParameters()),  # proto3: 0 is unset
        (
            {"confidenceThreshold": 1, "maxPredictions": 3.0},
            AutoMLParameters(confidence_threshold=1.0, max_predictions=3),
        ),
        (
            {"confidence_threshold": 0.25, "max_predictions": 2},
            AutoMLParameters(confidence_threshold=0.25, max_predictions=2),
        ),
    ],
)
def test_parameters_as_the_schema_message_reads_them(parameters, expected):
    from google.cloud.aiplatform.v1.schema.predict.params import ImageClassificationPredictionParams

    if parameters is not None:  # each is a valid ImageClassificationPredictionParams
        message = json_format.ParseDict(
            parameters, ImageClassificationPredictionParams.pb()(), ignore_unknown_fields=False
        )
        assert message.max_predictions in (0, expected.max_predictions)
    assert parse_automl_parameters(parameters) == expected


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"confidenceThreshold": -0.1}, "from 0 to 1, got a number outside that range"),
        ({"confidenceThreshold": True}, "got a JSON boolean"),
        ({"maxPredictions": 2**31}, "at most 2147483647"),
        ({"maxPredictions": "5"}, "got a JSON string"),
        ({"maxPredictions": 2, "max_predictions": 2}, "both maxPredictions and max_predictions"),
        ({"top_k": 2}, "parameters.maxPredictions"),
        ("x", "must be a JSON object"),
        ({"maxPrediction": 2}, "parameters 'maxPrediction': not a field of AutoML's"),
    ],
)
def test_bad_parameters_say_what_to_send(parameters, message):
    with pytest.raises(BadRequest, match=message):
        parse_automl_parameters(parameters)


def test_the_instances_key_chooses_the_format_and_mixing_is_refused():
    assert request_format([{"content": "x"}, "not an object"]) == "automl"
    assert request_format([{"b64": "x"}, {}]) == "tpustream"
    assert request_format([{}, 3]) == "tpustream"  # neither: each fails alone, in the b64 format's words
    with pytest.raises(BadRequest, match="mix"):
        request_format([{"b64": "x"}, {"content": "x"}])


def test_answer_keeps_the_top_predictions_at_or_over_the_threshold():
    from google.cloud.aiplatform.v1.schema.predict.prediction import ClassificationPredictionResult

    top = {"classes": ["cat", "dog", "fox"], "class_indices": [2, 0, 7], "probabilities": [0.5, 0.3, 0.2]}
    answer = automl_prediction(top, AutoMLParameters(confidence_threshold=0.3, max_predictions=10))
    assert answer == {"ids": ["2", "0"], "displayNames": ["cat", "dog"], "confidences": [0.5, 0.3]}
    parsed = json_format.ParseDict(answer, ClassificationPredictionResult.pb()(), ignore_unknown_fields=False)
    assert list(parsed.ids) == [2, 0]  # int64 in the schema: strings in its JSON, as AutoML answers
    assert automl_prediction(top, AutoMLParameters(max_predictions=1))["ids"] == ["2"]


def test_an_unknown_fields_name_is_said_only_when_it_is_a_short_identifier():
    assert field_names(["topk", "top-k", "k" * 41, "x_1"]) == (
        "'topk', 'x_1', 2 fields whose name is not a short identifier"
    )
    assert field_names(["<script>"]) == "1 field whose name is not a short identifier"
