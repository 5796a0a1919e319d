"""Pipeline runs, schedules, the Metadata service (the default store, contexts, addContextChildren: how a run
joins a Vertex AI Experiment) and CustomJobs (their hosts handed to ``job_runner``) in the Vertex fake.
"""

from __future__ import annotations

import re

from tests.fakes.vertex.rules import Refused, _now, validate_body


class RunsMixin:
    """VertexRecorder's pipeline jobs, schedules, metadata contexts and custom jobs (its state lives there)."""

    def _start_pipeline_job(self, parent: str, job: dict) -> None:
        """What Vertex does once a PipelineJob starts: its state RUNNING and, in the default metadata store,
        a ``system.PipelineRun`` context named after the job, which GET names in ``jobDetail`` (aiplatform's
        ``PipelineJob._get_context`` waits for it). The create reply itself carries none, as on Vertex."""
        from google.cloud import aiplatform_v1 as v1

        store = f"{parent}/metadataStores/default"
        self.metadata_stores.setdefault(store, {"name": store, "createTime": _now()})
        job_id = job["name"].rsplit("/", 1)[1]
        pipeline_name = job.get("pipelineSpec", {}).get("pipelineInfo", {}).get("name", "pipeline")
        pipeline = self._new_context(store, pipeline_name, "system.Pipeline")
        run = self._new_context(store, job_id, "system.PipelineRun")
        running = {
            **job,
            "state": "PIPELINE_STATE_RUNNING",
            "jobDetail": {"pipelineContext": dict(pipeline), "pipelineRunContext": dict(run)},  # as made
        }
        validate_body(v1.PipelineJob, running)  # the fake answers only fields Vertex has
        self.pipeline_jobs[job["name"]] = running

    def scheduled_run(self, schedule: str) -> str:
        """What Vertex's scheduler does at a cron tick of ``schedule``: create a PipelineJob from the schedule's
        ``createPipelineJobRequest`` (its ``pipelineJob``, under a new ID) and start it; returns its name."""
        from google.cloud import aiplatform_v1 as v1

        request = self.schedules[schedule]["createPipelineJobRequest"]
        run_id = f"{self.schedules[schedule]['displayName']}-{len(self.pipeline_jobs) + 1:04d}"
        job = {
            **request["pipelineJob"],
            "name": f"{request['parent']}/pipelineJobs/{run_id}",
            "scheduleName": schedule,
            "state": "PIPELINE_STATE_PENDING",
        }
        validate_body(v1.PipelineJob, job)
        self._start_pipeline_job(request["parent"], job)
        return job["name"]

    def _new_context(self, store: str, context_id: str, schema_title: str) -> dict:
        name = f"{store}/contexts/{context_id}"
        if name not in self.contexts:
            stamp = _now()
            self.contexts[name] = {
                "name": name,
                "displayName": context_id,
                "schemaTitle": schema_title,
                "schemaVersion": "0.0.1",
                "createTime": stamp,
                "updateTime": stamp,
            }
        return self.contexts[name]

    def _metadata_call(
        self, method: str, parent: str, rest: str, body: dict | None, query: dict
    ) -> tuple[dict, int]:
        """MetadataService: Get/CreateMetadataStore (an Operation), Get/CreateContext, AddContextChildren,
        with the rules the v1 API states (context IDs of 4-128 ``[a-z0-9-]``, ALREADY_EXISTS, NOT_FOUND)."""

        def not_found(name: str) -> tuple[dict, int]:
            return {"error": {"code": 404, "message": f"{name} not found.", "status": "NOT_FOUND"}}, 404

        m_store = re.match(
            r"^/metadataStores(?:/([^/]+))?(/contexts(?:/([^/:]+)(:addContextChildren)?)?)?$", rest
        )
        if m_store is None:
            return {"error": {"code": 404, "message": f"unhandled {method} {rest}"}}, 404
        store_id, contexts, context_id, add_children = m_store.groups()
        if not contexts:
            if method == "POST" and store_id is None:  # CreateMetadataStore
                name = f"{parent}/metadataStores/{query.get('metadataStoreId', ['default'])[0]}"
                self.metadata_stores[name] = {**(body or {}), "name": name, "createTime": _now()}
                return self._operation(
                    name, "CreateMetadataStore", self.metadata_stores[name], "MetadataStore"
                ), 200
            name = f"{parent}/metadataStores/{store_id}"
            if method == "GET" and name in self.metadata_stores:
                return self.metadata_stores[name], 200
            return not_found(name)
        store = f"{parent}/metadataStores/{store_id}"
        if store not in self.metadata_stores:
            return not_found(store)
        if method == "POST" and context_id is None:  # CreateContext
            new_id = query.get("contextId", [""])[0]
            if not re.fullmatch(r"[a-z0-9-]{4,128}", new_id):
                raise Refused(400, "INVALID_ARGUMENT", f"contextId {new_id!r}: 4-128 characters of [a-z0-9-]")
            name = f"{store}/contexts/{new_id}"
            if name in self.contexts:
                raise Refused(409, "ALREADY_EXISTS", f"Context {name} already exists.")
            stamp = _now()
            self.contexts[name] = {
                **(body or {}),
                "name": name,
                "createTime": stamp,
                "updateTime": stamp,
                "etag": f"AMEw{next(self._ids)}",
            }
            return self.contexts[name], 200
        name = f"{store}/contexts/{context_id}"
        if name not in self.contexts:
            return not_found(name)
        if method == "GET" and not add_children:
            return self.contexts[name], 200
        if method == "POST" and add_children and self.deny_add_children:
            self.deny_add_children -= 1
            permission = (
                "aiplatform.metadataStores.contexts.addContextChildren"  # roles/aiplatform.user has it
            )
            raise Refused(403, "PERMISSION_DENIED", f"Permission '{permission}' denied on resource '{name}'.")
        if method == "POST" and add_children:
            children = (body or {}).get("childContexts", [])
            missing = [child for child in children if child not in self.contexts]
            if missing:
                raise Refused(404, "NOT_FOUND", f"child contexts {missing} not found.")
            for child in children:
                parents = self.contexts[child].setdefault("parentContexts", [])
                if name not in parents:
                    parents.append(name)
            return {}, 200
        return {"error": {"code": 404, "message": f"unhandled {method} {rest}"}}, 404

    def _job_json(self, name: str) -> dict:
        job = self.jobs[name]
        reply = {
            "name": name,
            "displayName": job["body"].get("displayName", job["body"].get("display_name", "")),
            "state": job["state"],
        }
        if job["error"]:
            reply["error"] = job["error"]
        return reply

    def _run_job(self, name: str) -> None:
        job = self.jobs[name]
        job["state"] = "JOB_STATE_RUNNING"
        if self.job_runner is None:
            ok, message = True, ""
        else:
            try:
                ok, message = self.job_runner(job["body"], job["hosts"])
            except Exception as exc:  # the emulation itself broke: the job fails with why
                ok, message = False, f"job runner: {exc!r}"
        if not ok:
            job["error"] = {"code": 13, "message": message}  # INTERNAL: the launcher raises RuntimeError
        job["state"] = "JOB_STATE_SUCCEEDED" if ok else "JOB_STATE_FAILED"
