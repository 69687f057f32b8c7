"""Bad input gets a clear JSON error with the right status, and never touches other jobs.

Real Redis; no worker is needed (jobs that pass validation just wait in the queue).
"""
import pytest

from api import create_app
from common.schemas import JobStatus
from tests.support.settings import make_settings, settings_fixture

CHAT = [{"role": "user", "content": "Hello"}]


settings = settings_fixture(max_queue=3, max_body_bytes=100_000, max_tokens_cap=300)


def assert_error(resp, status, type_=None):
    assert resp.status_code == status, resp.get_data(as_text=True)
    body = resp.get_json()
    assert set(body) == {"error"} and body["error"]["message"]
    if type_:
        assert body["error"]["type"] == type_
    return body["error"]


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"messages": [}', b"\xff\xfe"])
def test_malformed_json_is_400(api, raw):
    assert_error(api.post("/v1/jobs", data=raw, content_type="application/json"), 400,
                 "invalid_request_error")


@pytest.mark.parametrize("body, field", [
    ({}, "body"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": ""}]}, "messages.0.content"),
    ({"messages": CHAT, "prompt": "both"}, "body"),
    ({"prompt": 42}, "prompt"),
    ({"messages": CHAT, "max_tokens": -1}, "max_tokens"),
    ({"messages": CHAT, "max_tokens": "ten"}, "max_tokens"),
    ({"messages": CHAT, "temperature": 9}, "temperature"),
    ({"messages": CHAT, "top_p": 0}, "top_p"),
    ({"messages": CHAT, "stop": [""]}, "stop"),
    ({"messages": CHAT, "colour": "blue"}, "colour"),
    ([1, 2, 3], "body"),
])
def test_invalid_fields_are_422_and_name_the_field(api, body, field):
    error = assert_error(api.post("/v1/jobs", json=body), 422, "validation_error")
    if field != "body":
        assert field in error["message"]


def test_max_tokens_above_the_cap_is_422(api):
    error = assert_error(api.post("/v1/jobs", json={"messages": CHAT, "max_tokens": 100_000}), 422)
    assert "300" in error["message"]


def test_prompt_longer_than_context_is_413(api):
    long_prompt = "word " * 3900  # ~3900 tokens; context 4096, so it cannot fit with max_tokens
    error = assert_error(api.post("/v1/jobs", json={"prompt": long_prompt * 2}), 413)
    assert error["type"] == "context_length_exceeded"
    # fits alone, but not with the max_tokens asked for: 413 that says how much is left
    error = assert_error(api.post("/v1/jobs", json={"prompt": long_prompt, "max_tokens": 300}), 413)
    assert "lower max_tokens" in error["message"]
    # without an explicit max_tokens the default is trimmed to what fits
    resp = api.post("/v1/jobs", json={"prompt": long_prompt, "cache": False})
    assert resp.status_code == 202
    api.delete(f"/v1/jobs/{resp.get_json()['id']}")


def test_body_over_the_size_limit_is_413(api):
    assert_error(api.post("/v1/jobs", json={"prompt": "x" * 150_000}), 413, "payload_too_large")


def test_unknown_model_is_404(api):
    assert_error(api.post("/v1/jobs", json={"messages": CHAT, "model": "gpt-9"}), 404, "model_not_found")


def test_unknown_job_is_404_everywhere(api):
    for resp in (api.get("/v1/jobs/nope"), api.get("/v1/jobs/nope/events"),
                 api.delete("/v1/jobs/nope"), api.post("/v1/jobs/nope/cancel")):
        assert_error(resp, 404, "not_found")


def test_unknown_route_and_wrong_method_are_json(api):
    assert_error(api.get("/v2/whatever"), 404)
    assert_error(api.put("/v1/jobs"), 405)


def test_cancel_queued_job_then_cancel_again_is_409_and_it_never_runs(api, settings):
    job = api.post("/v1/jobs", json={"messages": CHAT, "cache": False}).get_json()
    assert job["status"] == "queued"
    cancelled = api.delete(f"/v1/jobs/{job['id']}")
    assert cancelled.status_code == 200
    assert cancelled.get_json()["status"] == "cancelled"
    assert_error(api.post(f"/v1/jobs/{job['id']}/cancel"), 409, "conflict")
    # when a worker later receives the message, the job is not started
    store = api.application.extensions["llmq"].jobs
    outcome, _ = store.claim(job["id"], "w", max_attempts=3)
    assert outcome == "cancelled"
    assert store.get(job["id"])["status"] == "cancelled"
    # and its event log is closed, so SSE listeners end
    assert [e for _, e, _ in store.token_log.read_events(job["id"])] == ["done"]


def test_full_queue_is_429_with_retry_after_and_queued_jobs_are_untouched(api, settings):
    store = api.application.extensions["llmq"].jobs
    admitted = []
    while True:
        resp = api.post("/v1/jobs", json={"prompt": f"job {len(admitted)}", "cache": False})
        if resp.status_code != 202:
            break
        admitted.append(resp.get_json()["id"])
    assert_error(resp, 429, "queue_full")
    assert int(resp.headers["Retry-After"]) > 0
    assert store.queue_depth() == settings.max_queue
    assert all(store.status(j) is JobStatus.QUEUED for j in admitted)
    for job_id in admitted:  # make room for other tests
        api.delete(f"/v1/jobs/{job_id}")


def test_redis_down_is_503(model_ref):
    app = create_app(make_settings(redis_url="redis://127.0.0.1:1/0"))
    resp = app.test_client().post("/v1/jobs", json={"messages": CHAT})
    assert_error(resp, 503, "service_unavailable")
    assert resp.headers["Retry-After"]
    assert app.test_client().get("/health").status_code == 503


def test_a_valid_job_is_accepted_with_location(api):
    resp = api.post("/v1/jobs", json={"messages": CHAT, "max_tokens": 10, "stop": "x", "cache": False})
    assert resp.status_code == 202
    job = resp.get_json()
    assert resp.headers["Location"] == f"/v1/jobs/{job['id']}" == job["links"]["self"]
    assert job["usage"]["prompt_tokens"] > 0 and job["status"] == "queued"
    api.delete(f"/v1/jobs/{job['id']}")


def test_a_malformed_last_event_id_is_400_and_a_good_one_is_taken(api):
    store = api.application.extensions["llmq"].jobs
    store.create_finished("finished-job", {"id": "finished-job", "status": "succeeded", "model": "m",
                                           "created_at": 1.0, "text": "hi"})
    for bad in ("abc", "1-2-3", "-5"):
        error = assert_error(api.get("/v1/jobs/finished-job/events", headers={"Last-Event-ID": bad}), 400,
                             "invalid_last_event_id")
        assert bad in error["message"]
    assert_error(api.get("/v1/jobs/finished-job/events?last_event_id=x"), 400, "invalid_last_event_id")
    assert api.get("/v1/jobs/finished-job/events", headers={"Last-Event-ID": "1733356800000-0"}).status_code == 200
