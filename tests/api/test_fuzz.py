"""Hostile input: property-based requests (hypothesis) and schemathesis against `/openapi.json`.

Whatever arrives, the API answers with a documented status, never a 500, never hangs, and every
error is `{"error": {"type", "message"}}`. Real Redis, no worker: accepted jobs just wait (and
expire within seconds, which also ends any event stream a fuzzer opens on one).
"""
import json
from urllib.parse import quote

import pytest
import schemathesis
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from openapi_spec_validator import validate

from api import create_app
from common.api_keys import hash_key
from tests.support.settings import cleanup_namespace, make_settings, settings_fixture

FUZZ = hypothesis_settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck),
                derandomize=True)  # reproducible in CI
ACCEPTED = {200, 202}
REJECTED = {400, 403, 404, 405, 409, 413, 422, 429}


# webhooks off: a fuzzed webhook URL is refused before any DNS lookup of its host
settings = settings_fixture(max_queue=100_000, queue_timeout_s=2, sse_heartbeat_s=0.3, max_body_bytes=20_000,
                            webhook_secrets="")


def check_response(resp, allowed=ACCEPTED | REJECTED):
    assert resp.status_code in allowed, (resp.status_code, resp.get_data(as_text=True)[:500])
    if resp.status_code >= 400:
        body = resp.get_json(silent=True)
        assert isinstance(body, dict) and set(body) == {"error"}, resp.get_data(as_text=True)[:500]
        assert isinstance(body["error"]["type"], str) and body["error"]["type"]
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        if resp.status_code == 429:
            assert int(resp.headers["Retry-After"]) > 0
    return resp


def forget(client, resp):
    """Cancel a job the fuzzer got accepted, so the queue stays small."""
    if resp.status_code == 202:
        assert client.delete(f"/v1/jobs/{resp.get_json()['id']}").status_code in (200, 409)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)


def valid_or_not(valid):
    return st.one_of(valid, json_values)


messages = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["user", "system", "assistant", "tool", ""]),
    "content": st.text(max_size=60)}), max_size=3)

requests_ = st.fixed_dictionaries({}, optional={
    "messages": valid_or_not(messages),
    "prompt": valid_or_not(st.text(max_size=200)),
    "max_tokens": valid_or_not(st.integers(-5, 5000)),
    "temperature": valid_or_not(st.floats(-1, 3)),
    "top_p": valid_or_not(st.floats(-0.5, 1.5)),
    "top_k": valid_or_not(st.integers(-5, 100)),
    "seed": valid_or_not(st.integers(-1, 2**65)),
    "stop": valid_or_not(st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=10))),
    "stream": valid_or_not(st.booleans()),
    "cache": valid_or_not(st.booleans()),
    "model": valid_or_not(st.text(max_size=20)),
    "priority": valid_or_not(st.sampled_from(["high", "normal", "low", "urgent"])),
    "queue_timeout": valid_or_not(st.floats(-1, 10**7)),
    "run_timeout": valid_or_not(st.floats(-1, 10**7)),
})


@FUZZ
@given(body=requests_)
def test_near_valid_job_requests(api, body):
    resp = check_response(api.post("/v1/jobs", json=body))
    if resp.status_code in ACCEPTED:
        job = resp.get_json()
        assert job["id"] and job["status"] in ("queued", "succeeded") and job["links"]["self"]
    forget(api, resp)


@FUZZ
@given(body=json_values)
def test_any_json_value_as_a_body(api, body):
    forget(api, check_response(api.post("/v1/jobs", data=json.dumps(body),
                                        content_type="application/json")))


@FUZZ
@given(raw=st.binary(max_size=400), content_type=st.sampled_from(
    ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]))
def test_any_bytes_as_a_body(api, raw, content_type):
    forget(api, check_response(api.post("/v1/jobs", data=raw, content_type=content_type)))


@FUZZ
@given(job_id=st.text(min_size=1, max_size=80), method=st.sampled_from(["GET", "DELETE", "POST", "PUT"]),
       suffix=st.sampled_from(["", "/events", "/cancel"]))
def test_any_job_path(api, job_id, method, suffix):
    resp = api.open(f"/v1/jobs/{quote(job_id, safe='')}{suffix}", method=method)
    check_response(resp, allowed=REJECTED)


def test_the_openapi_document_is_valid_and_describes_the_api(api):
    spec = api.get("/openapi.json").get_json()
    validate(spec)
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events", "/health"} <= set(spec["paths"])
    body = spec["components"]["schemas"]["JobRequest"]
    assert {"messages", "prompt", "max_tokens", "priority", "queue_timeout", "run_timeout"} <= set(body["properties"])


@pytest.fixture(scope="module")
def keyed_client(model_ref):
    settings = make_settings(api_keys=f"fuzz:{hash_key('fuzz-key')}")
    yield create_app(settings).test_client()
    cleanup_namespace(settings)


@FUZZ
@given(header=st.one_of(st.text(max_size=80), st.text(max_size=60).map(lambda t: f"Bearer {t}")))
def test_any_authorization_header_is_401_unless_it_is_the_key(keyed_client, header):
    try:
        resp = keyed_client.get("/v1/jobs/x", headers={"Authorization": header})
    except ValueError:  # a header value HTTP itself cannot carry (e.g. a newline)
        return
    check_response(resp, allowed={401, 404})
    assert (resp.status_code == 404) == (header.strip() == "Bearer fuzz-key")


# A body over `max_body_bytes` is refused with a 413 before it is read, valid or not, which no
# schema can say (schemathesis's default lists lack 413)
REJECTIONS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
ACCEPTANCES = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]


@pytest.fixture
def api_schema(app):
    config = schemathesis.Config.from_dict({"checks": {
        "negative_data_rejection": {"expected-statuses": REJECTIONS},
        "positive_data_acceptance": {"expected-statuses": ACCEPTANCES}}})
    return schemathesis.openapi.from_wsgi("/openapi.json", app, config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@hypothesis_settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True)  # the same examples on every run: CI reproduces what passed here
def test_schemathesis(case):
    """Every operation: no server errors, documented status codes, conforming bodies and headers,
    schema-valid data accepted and invalid data rejected, 405 with `Allow` for other methods."""
    # Whether a webhook URL is accepted depends on what its host resolves to and on the server's
    # settings, which no schema can say: a schema-valid one may be refused (with a 422).
    webhook = isinstance(case.body, dict) and case.body.get("webhook") is not None
    # Nor can it say that a tool_choice names one of the tools, or that two tools differ in name.
    tools = isinstance(case.body, dict) and (case.body.get("tools") or case.body.get("tool_choice"))
    # Nor which prompt_lookup a request may name: only its model's own setting (else a 400).
    lookup = isinstance(case.body, dict) and case.body.get("prompt_lookup") is not None
    excluded = [positive_data_acceptance] if webhook or tools or lookup else []
    if (case.method, case.path) == ("POST", "/v1/files"):
        # a multipart part is bytes whatever "type" the fuzzer meant (an integer file is the
        # file "0"), and no schema can say that a file's bytes must be UTF-8
        excluded = [positive_data_acceptance, negative_data_rejection]
    case.call_and_validate(excluded_checks=excluded or None)
    # accepted jobs expire from the queue within 2 s
