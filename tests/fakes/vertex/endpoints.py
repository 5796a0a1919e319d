"""Endpoints in the Vertex fake: create/get/list/update, DeployModel and UndeployModel as long-running
operations (``hold_deploys`` keeps a deployment in flight until ``finish_deploys``; ListOperations answers a
page at a time), with the rules Vertex documents for traffic splits and a custom model's dedicated resources.
"""

from __future__ import annotations

import json
import re

from tests.fakes.vertex.rules import Refused, _now, _split_problem, validate_body


class EndpointsMixin:
    """VertexRecorder's endpoints and their long-running operations (its state lives there)."""

    def _operation(self, resource: str, kind: str, response: dict | None, response_type: str) -> dict:
        """A long-running operation under ``resource``, done at its first poll (the reply is not done yet)."""
        from google.cloud import aiplatform_v1 as v1

        name = f"{resource}/operations/{9000 + len(self.operations)}"
        stamp = _now()
        metadata = {
            "@type": f"type.googleapis.com/google.cloud.aiplatform.v1.{kind}OperationMetadata",
            "genericMetadata": {"createTime": stamp, "updateTime": stamp},
        }
        done = {
            "name": name,
            "metadata": metadata,
            "done": True,
            "response": {
                "@type": f"type.googleapis.com/google.cloud.aiplatform.v1.{response_type}",
                **(response or {}),
            },
        }
        validate_body(getattr(v1, response_type), response or {})  # the fake answers only fields Vertex has
        self.operations[name] = done
        return {"name": name, "metadata": metadata}

    def _list_operations(self, endpoint: str, query: dict) -> dict:
        """google.longrunning ListOperations on ``endpoint``, a page at a time as the API defines it
        (google/longrunning/operations_proto.proto: ``page_size``, ``page_token``, ``next_page_token``): at
        most ``pageSize`` operations (the server's ``operations_page_size`` when unset or larger), oldest first,
        and a ``nextPageToken`` while more remain; the token is opaque to the client."""
        under = [op for name, op in self.operations.items() if name.startswith(f"{endpoint}/operations/")]
        size = int(query.get("pageSize", ["0"])[0] or 0)
        if size < 0:
            raise Refused(400, "INVALID_ARGUMENT", f"pageSize {size} is negative")
        size = min(size or self.operations_page_size, self.operations_page_size)
        token = query.get("pageToken", [""])[0]
        start = 0
        if token:
            m = re.match(r"^ops-after-(\d+)$", token)
            if m is None or int(m.group(1)) > len(under):
                raise Refused(400, "INVALID_ARGUMENT", f"Invalid page token {token!r}")
            start = int(m.group(1))
        page: dict[str, object] = {"operations": under[start : start + size]}
        if start + size < len(under):
            page["nextPageToken"] = f"ops-after-{start + size}"
        return page

    def _endpoint_json(self, name: str) -> dict:
        from google.cloud import aiplatform_v1 as v1

        endpoint = self.endpoints[name]
        validate_body(v1.Endpoint, endpoint)
        return json.loads(json.dumps(endpoint))  # a copy: later changes do not alter a recorded reply

    def _endpoints_call(self, method: str, parent: str, body: dict | None, query: dict) -> tuple[dict, int]:
        """EndpointService.CreateEndpoint (an Operation) and ListEndpoints with its display_name filter."""
        if method == "GET":
            wanted = re.findall(r'display_name="([^"]*)"', query.get("filter", [""])[0])
            return {
                "endpoints": [
                    self._endpoint_json(name)
                    for name, endpoint in self.endpoints.items()
                    if name.startswith(f"{parent}/") and (not wanted or endpoint["displayName"] in wanted)
                ]
            }, 200
        if method != "POST" or not body:
            return {"error": {"code": 404, "message": f"unhandled {method} {parent}/endpoints"}}, 404
        if not body.get("displayName"):
            raise Refused(400, "INVALID_ARGUMENT", "Endpoint.displayName is required")
        endpoint_id = query.get("endpointId", [str(5100 + len(self.endpoints))])[0]
        # CreateEndpointRequest.endpoint_id (aiplatform_v1 types/endpoint_service.py): a lowercase letter
        # then up to 62 of [a-z0-9-], the last a letter or digit; or up to 9 digits, no leading zero.
        if not re.match(r"^(?:[1-9][0-9]{0,8}|[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?)$", endpoint_id):
            raise Refused(400, "INVALID_ARGUMENT", f"Invalid endpoint_id {endpoint_id!r}")
        name = f"{parent}/endpoints/{endpoint_id}"
        if name in self.endpoints:
            raise Refused(409, "ALREADY_EXISTS", f'Endpoint "{name}" already exists.')
        stamp = _now()
        self.endpoints[name] = {
            **{
                k: v
                for k, v in body.items()
                if k in ("displayName", "description", "labels", "dedicatedEndpointEnabled")
            },
            # Endpoint.dedicated_endpoint_dns: "https://{endpoint_id}.{region}-{uid}.prediction.vertexai.goog"
            **(
                {"dedicatedEndpointDns": f"{endpoint_id}.{parent.split('/')[3]}-0.prediction.vertexai.goog"}
                if body.get("dedicatedEndpointEnabled")
                else {}
            ),
            "name": name,
            "createTime": stamp,
            "updateTime": stamp,
            "etag": f"AMEw{next(self._ids)}",
        }
        return self._operation(name, "CreateEndpoint", self._endpoint_json(name), "Endpoint"), 200

    def _endpoint_call(
        self, method: str, name: str, action: str | None, body: dict | None, query: dict
    ) -> tuple[dict, int]:
        """GetEndpoint, UpdateEndpoint (PATCH with updateMask), DeployModel and UndeployModel (Operations)."""
        endpoint = self.endpoints.get(name)
        if endpoint is None:
            message = f'Endpoint "{name}" not found.'
            return {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}}, 404
        deployed = {dm["id"] for dm in endpoint.get("deployedModels", [])}
        if method == "GET" and not action:
            return self._endpoint_json(name), 200
        body = body or {}
        if method == "PATCH" and not action:
            mask = [p for item in query.get("updateMask", []) for p in item.split(",") if p]
            if not mask or set(mask) - {
                "displayName",
                "description",
                "labels",
                "trafficSplit",
                "display_name",
                "traffic_split",
            }:
                raise Refused(
                    400, "INVALID_ARGUMENT", f"updateMask {mask} is empty or names fields not updatable"
                )
            for path in mask:
                field = re.sub(r"_(\w)", lambda m: m.group(1).upper(), path)
                if field == "trafficSplit":
                    problem = _split_problem(body.get("trafficSplit", {}), deployed)
                    if problem:
                        raise Refused(400, "INVALID_ARGUMENT", problem)
                if field in body:
                    endpoint[field] = body[field]
                else:
                    endpoint.pop(field, None)
            endpoint.update(updateTime=_now(), etag=f"AMEw{next(self._ids)}")
            return self._endpoint_json(name), 200
        if method == "POST" and action == "deployModel":
            return self._deploy(name, endpoint, deployed, body), 200
        if method == "POST" and action == "undeployModel":
            return self._undeploy(name, endpoint, deployed, body), 200
        return {"error": {"code": 404, "message": f"unhandled {method} {name}:{action}"}}, 404

    def _deploy(self, name: str, endpoint: dict, deployed: set[str], body: dict) -> dict:
        """DeployModel, with the rules Vertex documents for a custom-trained model (DeployedModel,
        DedicatedResources, DeployModelRequest.traffic_split in aiplatform_v1 types/endpoint*.py)."""
        requested = body["deployedModel"]
        m = re.match(
            r"^(projects/[^/]+/locations/[^/]+)/models/(\d+)(?:@([\w-]+))?$", requested.get("model", "")
        )
        model_id = m.group(2) if m else None
        if m is None or model_id not in self.models or self._version(model_id, m.group(3)) is None:
            raise Refused(404, "NOT_FOUND", f"Model {requested.get('model')!r} not found.")
        version = self._version(model_id, m.group(3))
        resources = requested.get("dedicatedResources")
        if not resources or requested.get("automaticResources"):
            raise Refused(
                400,
                "INVALID_ARGUMENT",
                "a custom-trained model needs dedicatedResources (automaticResources are not supported)",
            )
        if not resources.get("machineSpec", {}).get("machineType"):
            raise Refused(400, "INVALID_ARGUMENT", "dedicatedResources.machineSpec.machineType is required")
        low, high = resources.get("minReplicaCount", 0), resources.get("maxReplicaCount", 0)
        if low < 1 or (high and high < low):
            raise Refused(
                400,
                "INVALID_ARGUMENT",
                f"minReplicaCount must be >= 1 and maxReplicaCount >= it, got {low} and {high}",
            )
        split = body.get("trafficSplit", {})
        problem = _split_problem(split, deployed, "0")
        if problem:
            raise Refused(400, "INVALID_ARGUMENT", problem)
        new_id = str(7_700_000_000_000_000_000 + next(self._ids))  # Vertex's ids are 19-digit numbers
        model = self.models[model_id]
        deployed_model = {
            "id": new_id,
            "model": f"{m.group(1)}/models/{model_id}",
            "modelVersionId": version,
            "displayName": requested.get("displayName") or model["displayName"],
            "dedicatedResources": resources,
            "createTime": _now(),
        }

        def apply() -> None:
            endpoint.setdefault("deployedModels", []).append(deployed_model)
            if split:  # "0" is the model being deployed (DeployModelRequest.traffic_split)
                endpoint["trafficSplit"] = {(new_id if k == "0" else k): v for k, v in split.items()}
            endpoint.update(updateTime=_now(), etag=f"AMEw{next(self._ids)}")

        reply = self._operation(name, "DeployModel", {"deployedModel": deployed_model}, "DeployModelResponse")
        if not self.hold_deploys:
            apply()
            return reply
        running = self.operations[reply["name"]]
        self.operations[reply["name"]] = {
            "name": running["name"],
            "metadata": running["metadata"],
            "done": False,
        }
        self._held.append(
            (reply["name"], lambda: (apply(), self.operations.__setitem__(reply["name"], running)))
        )
        return reply

    def finish_deploys(self) -> int:
        """Complete every held DeployModel: the models are deployed and the operations done. Returns how many."""
        held, self._held = self._held, []
        for _, finish in held:
            finish()
        return len(held)

    def _undeploy(self, name: str, endpoint: dict, deployed: set[str], body: dict) -> dict:
        """UndeployModel: the model must end with no traffic; a given trafficSplit replaces the endpoint's
        (UndeployModelRequest.traffic_split)."""
        gone = body.get("deployedModelId", "")
        if gone not in deployed:
            raise Refused(404, "NOT_FOUND", f"DeployedModel {gone!r} not found on {name}.")
        if "trafficSplit" in body:
            split = body["trafficSplit"]
            problem = _split_problem(split, deployed - {gone}) if split or deployed - {gone} else None
            if problem or split.get(gone):
                raise Refused(400, "INVALID_ARGUMENT", problem or f"trafficSplit still gives {gone} traffic")
        else:
            split = dict(endpoint.get("trafficSplit", {}))
            if split.get(gone):
                raise Refused(
                    400,
                    "FAILED_PRECONDITION",
                    f"DeployedModel {gone} has {split[gone]}% of the traffic: give a trafficSplit without it",
                )
        endpoint["deployedModels"] = [dm for dm in endpoint["deployedModels"] if dm["id"] != gone]
        endpoint["trafficSplit"] = {k: v for k, v in split.items() if k != gone}
        endpoint.update(updateTime=_now(), etag=f"AMEw{next(self._ids)}")
        return self._operation(name, "UndeployModel", {}, "UndeployModelResponse")
