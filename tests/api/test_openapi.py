"""`/openapi.json` describes every route a user calls, and what the code builds fits it.

The routes are the app's own URL map, method by method: a route added without its description (or
a description left behind by a removed route) fails here. The few routes that are not the API are
named, with why, in `NOT_API`. The second half checks the objects still built as dicts (a job's
`queued` event) against the schemas the document gives them, a live stream's events, and the live
answers of the Files and Batches routes against the schema each route names (they are built from
the models the document is generated from, as OpenAI's completions, chunks and errors are: this
checks that each route names the right one, and that what is sent is what the model describes).
The fuzz tests (tests/api/test_fuzz.py) check the live answers too."""
from __future__ import annotations

import io
import re

import jsonschema
import pytest

from common.eta import Estimate, place_fields
from common.sseclient import iter_sse
from tests.support.batches import chat_line, jsonl
from tests.support.settings import settings_fixture

NOT_API = {
    "/": "the web chat page (HTML)",
    "/ui/config": "the chat page's own settings",
    "/ui/static/<path:filename>": "the chat page's script and styles",
    "/static/<path:filename>": "Flask's static folder",
    "/metrics": "Prometheus metrics, for a scraper",
}
METHODS = {"get", "put", "post", "delete", "patch"}


settings = settings_fixture(sse_heartbeat_s=0.2)


@pytest.fixture
def spec(api):
    resp = api.get("/openapi.json")
    assert resp.status_code == 200
    return resp.get_json()


def openapi_path(rule: str) -> str:
    """A Flask rule as an OpenAPI path: `/v1/models/<path:model>` -> `/v1/models/{model}`."""
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


def test_every_route_a_user_calls_is_described_and_nothing_else(app, spec):
    rules = list(app.url_map.iter_rules())
    routes = {(openapi_path(rule.rule), method.lower()) for rule in rules if rule.rule not in NOT_API
              for method in rule.methods - {"HEAD", "OPTIONS"}}
    described = {(path, method) for path, item in spec["paths"].items() for method in item
                 if method in METHODS}
    assert sorted(routes - described) == [], "routes missing from /openapi.json"
    assert sorted(described - routes) == [], "described, but no such route"
    assert set(NOT_API) <= {rule.rule for rule in rules}, "NOT_API names a route that is gone"


def test_the_job_stream_describes_each_event_queued_included(spec):
    stream = spec["paths"]["/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    events = {e["properties"]["event"]["const"]: e["properties"]["data"]["contentSchema"]["$ref"]
              for e in stream["text/event-stream"]["schema"]["oneOf"]}
    assert events == {name: f"#/components/schemas/JobEvent{name.title()}"
                      for name in ("chunk", "queued", "restart", "done")}
    queued = spec["components"]["schemas"]["JobEventQueued"]
    assert queued["required"] == ["queue_position"]
    assert {"estimated_start", "estimated_finish"} <= set(queued["properties"])
    for path in ("/v1/chat/completions", "/v1/completions"):  # OpenAI streams carry it as a comment
        assert ": queued" in spec["paths"][path]["post"]["responses"]["200"]["description"]


def fits(spec: dict, name: str, value) -> None:
    """`value` is valid against component `name` (its $refs resolved within the document)."""
    schema = {"$ref": f"#/components/schemas/{name}", "components": spec["components"]}
    jsonschema.Draft202012Validator(schema).validate(value)


@pytest.mark.parametrize("name, value", [
    ("JobEventQueued", place_fields(0, None)),
    ("JobEventQueued", place_fields(4, Estimate(start_in_s=2.5, finish_in_s=4.0))),
])
def test_what_the_code_builds_fits_its_schema(spec, name, value):
    fits(spec, name, value)


def fits_its_route(spec: dict, resp, path: str, method: str) -> dict:
    """A 200 answer of `method path` is valid against the schema the document gives that answer."""
    assert resp.status_code == 200, resp.get_data(as_text=True)
    schema = spec["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator({**schema, "components": spec["components"]}).validate(resp.get_json())
    return resp.get_json()


def test_files_and_batches_answers_fit_their_routes_schemas(api, spec):
    """Every Files and Batches answer, live: a file, a page of files, a batch with metadata and
    one with a webhook (its delivery state shown), a cancelled batch, a page of batches, a
    deleted file."""
    upload = api.post("/v1/files", content_type="multipart/form-data", data={
        "purpose": "batch", "file": (io.BytesIO(jsonl([chat_line("a", "Hi"), chat_line("b", "Yo")])), "in.jsonl")})
    file_id = fits_its_route(spec, upload, "/v1/files", "post")["id"]
    fits_its_route(spec, api.get(f"/v1/files/{file_id}"), "/v1/files/{file_id}", "get")
    assert fits_its_route(spec, api.get("/v1/files"), "/v1/files", "get")["data"]
    batch = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    fits_its_route(spec, api.post("/v1/batches", json={**batch, "metadata": {"k": "v"}}), "/v1/batches", "post")
    hooked = fits_its_route(spec, api.post("/v1/batches", json={**batch, "webhook": "http://127.0.0.1:9/hook"}),
                            "/v1/batches", "post")
    assert hooked["webhook"]["state"] == "waiting"
    cancelled = fits_its_route(spec, api.post(f"/v1/batches/{hooked['id']}/cancel"),
                               "/v1/batches/{batch_id}/cancel", "post")
    assert cancelled["status"] == "cancelling"
    fits_its_route(spec, api.get(f"/v1/batches/{hooked['id']}"), "/v1/batches/{batch_id}", "get")
    assert len(fits_its_route(spec, api.get("/v1/batches"), "/v1/batches", "get")["data"]) == 2
    fits_its_route(spec, api.delete(f"/v1/files/{file_id}"), "/v1/files/{file_id}", "delete")


def test_a_waiting_jobs_stream_sends_the_events_described(api, spec):
    """No worker: the job waits, so its stream says where it is in line (`queued`); cancelled, it
    ends with `done`. Each event's data fits the schema of its name."""
    resp = api.post("/v1/jobs", json={"prompt": "Say yes.", "max_tokens": 1, "cache": False})
    assert resp.status_code == 202, resp.get_data(as_text=True)
    job_id = resp.get_json()["id"]
    stream = api.get(f"/v1/jobs/{job_id}/events", buffered=False)
    names = []
    try:
        lines = (line for chunk in stream.response for line in chunk.decode().split("\n"))
        for event in iter_sse(lines):
            names.append(event.event)
            fits(spec, f"JobEvent{event.event.title()}", event.json())
            if event.event == "queued" and names.count("queued") == 1:
                assert event.json()["queue_position"] == 1
                assert api.delete(f"/v1/jobs/{job_id}").status_code == 200
            if event.event == "done":
                assert event.json()["status"] == "cancelled"
                break
    finally:
        stream.close()
    assert names[0] == "queued" and names[-1] == "done", names
