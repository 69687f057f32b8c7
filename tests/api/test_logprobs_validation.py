"""`logprobs`, `top_logprobs` and `n`: bad values, and logprobs an engine cannot give, are refused
when the request comes (Flask client, real Redis, no worker: only refused requests are sent, or
jobs that are queued and answered at once)."""
import json

import pytest

from tests.support.settings import fresh_namespace

MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Hello"}]



def openai_error(resp, status=400):
    assert resp.status_code == status, resp.get_data(as_text=True)
    return resp.get_json()["error"]


@pytest.mark.parametrize("extra, param", [
    ({"n": 0}, "n"),
    ({"n": 9}, "n"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true, as OpenAI refuses it
    ({"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ({"n": 2, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "n"),
    ({"logprobs": True, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "logprobs"),
])
def test_bad_chat_values_are_400_naming_the_parameter(api, extra, param):
    error = openai_error(api.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, **extra}))
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("extra, param", [
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"n": 9}, "n"),
    ({"n": 2, "best_of": 3}, "best_of"),
])
def test_bad_completion_values_are_400_naming_the_parameter(api, extra, param):
    error = openai_error(api.post("/v1/completions", json={"model": MODEL, "prompt": "x", **extra}))
    assert error["param"] == param


@pytest.mark.parametrize("extra", [{"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21},
                                   {"logprobs": "true"}, {"logprobs": True, "top_logprobs": 2.5}])
def test_jobs_api_refuses_bad_logprobs_with_422(api, extra):
    resp = api.post("/v1/jobs", json={"prompt": "Hi", **extra})
    assert resp.status_code == 422, resp.get_data(as_text=True)
    assert "logprobs" in resp.get_json()["error"]["message"]


def test_top_logprobs_beyond_the_engine_of_the_live_workers_are_400_naming_it(api, settings):
    """OpenVINO GenAI computes only the chosen token's logprob: alternatives are refused while
    OpenVINO workers hold the model, and the chosen token's logprob alone is accepted."""
    svc = api.application.extensions["llmq"]
    svc.redis.hset(svc.keys.workers, "ov", json.dumps({"name": "ov", "model": MODEL, "engine": "openvino"}))
    svc.redis.set(svc.keys.worker_alive("ov"), "1", ex=30)
    try:
        for path, body in (("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "logprobs": True,
                                                     "top_logprobs": 2}),
                           ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 1})):
            error = openai_error(api.post(path, json=body))
            assert "openvino" in error["message"] and "at most 0" in error["message"]
        resp = api.post("/v1/jobs", json={"prompt": "Hi", "logprobs": True, "top_logprobs": 1})
        assert resp.status_code == 400 and "openvino" in resp.get_json()["error"]["message"]
        accepted = api.post("/v1/jobs", json={"prompt": "Hi", "logprobs": True})
        assert accepted.status_code == 202, accepted.get_data(as_text=True)
        api.delete(f"/v1/jobs/{accepted.get_json()['id']}")
    finally:
        svc.redis.hdel(svc.keys.workers, "ov")
        svc.redis.delete(svc.keys.worker_alive("ov"))


def test_an_engine_named_in_the_settings_is_checked_before_any_worker_is_up(model_ref):
    from api import create_app

    with fresh_namespace(engine="openvino") as settings:
        client = create_app(settings).test_client()
        error = openai_error(client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": CHAT, "logprobs": True, "top_logprobs": 5}))
        assert error["param"] == "top_logprobs" and "openvino" in error["message"]


def test_a_batch_lines_result_carries_its_logprobs_in_the_endpoints_shape():
    from common.batch_lines import result_of
    from common.openai_format import Surface

    entries = [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": [
        {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}]},
        {"token": "!", "logprob": -1.0, "bytes": [33], "top_logprobs": [
            {"token": "!", "logprob": -1.0, "bytes": [33]}]}]
    record = {"id": "j1", "status": "succeeded", "text": "Hi!", "finish_reason": "stop", "created_at": 1.0,
              "model": MODEL, "prompt_tokens": 3, "completion_tokens": 2, "logprobs": entries}
    _, line = result_of(Surface(chat=False), "c1", record, None)
    assert line["response"]["body"]["choices"][0]["logprobs"] == {
        "tokens": ["Hi", "!"], "token_logprobs": [-0.5, -1.0], "top_logprobs": [{"Hi": -0.5}, {"!": -1.0}],
        "text_offset": [0, 2]}
    _, line = result_of(Surface(chat=True), "c1", record, None)
    assert line["response"]["body"]["choices"][0]["logprobs"] == {"content": entries, "refusal": None}


def test_when_a_choice_is_refused_the_choices_admitted_before_it_are_cancelled(model_ref):
    from api import create_app

    with fresh_namespace(max_queue=2) as settings:
        app = create_app(settings)
        resp = app.test_client().post("/v1/chat/completions", json={
            "model": MODEL, "messages": CHAT, "n": 3, "temperature": 1.0})
        assert openai_error(resp, 429)["code"] == "queue_full"
        svc = app.extensions["llmq"]
        assert svc.jobs.queue_depth() == 0  # the two admitted siblings left the queue
