"""What the serving container promises Vertex AI: the handler and predictor it runs, its port and routes.

``tpustream.serve.server`` implements them; ``tpustream.vertex.model_registry`` names them in the uploaded model's container spec
and ``tpustream.serve.validate`` starts the model server with them. They live apart from ``server`` so that
those modules need neither its image code nor torch to read four constants.
"""

from __future__ import annotations

__all__ = ["SERVING_ENV", "SERVING_PORT", "HEALTH_ROUTE", "PREDICT_ROUTE"]

# What the serving image runs (containers/serve/Dockerfile sets the same; promote uploads them as the
# container's env): tpustream.serve.server's handler and predictor, in the places LocalModel.build_cpr_model sets.
SERVING_ENV = {
    "HANDLER_MODULE": "tpustream.serve.server",
    "HANDLER_CLASS": "ClassifierHandler",
    "PREDICTOR_MODULE": "tpustream.serve.server",
    "PREDICTOR_CLASS": "ClassifierPredictor",
}
# The CPR defaults (google.cloud.aiplatform.prediction.DEFAULT_HTTP_PORT / _HEALTH_ROUTE / _PREDICT_ROUTE):
# the upload names them in the container spec and Vertex passes them back as AIP_HTTP_PORT etc.
SERVING_PORT = 8080
HEALTH_ROUTE = "/health"
PREDICT_ROUTE = "/predict"
