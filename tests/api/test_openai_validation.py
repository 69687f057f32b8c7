"""The OpenAI surface's validation, error shape and model list, with the Flask client and real Redis;
no worker (accepted requests would wait in the queue, so only refused ones are sent)."""
import json

import pytest

from api import create_app
from tests.support.settings import make_settings, settings_fixture

MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Hello"}]


settings = settings_fixture(max_tokens_cap=300)


def openai_error(resp, status):
    assert resp.status_code == status, resp.get_data(as_text=True)
    body = resp.get_json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("body, param", [
    ({"messages": CHAT}, "model"),
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),
    ({"model": MODEL, "messages": [{"role": "function", "content": "x"}]}, "messages.0.role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages.0.content"),
    ({"model": MODEL, "messages": CHAT, "n": 9}, "n"),
    ({"model": MODEL, "messages": CHAT, "logit_bias": {"50256": -100}}, "logit_bias"),
    ({"model": MODEL, "messages": CHAT, "tool_choice": "required"}, "tool_choice"),
    ({"model": MODEL, "messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"model": MODEL, "messages": CHAT, "tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"model": MODEL, "messages": CHAT, "top_p": 0}, "top_p"),
    ({"model": MODEL, "messages": CHAT, "presence_penalty": 3}, "presence_penalty"),
    ({"model": MODEL, "messages": CHAT, "max_tokens": 10, "max_completion_tokens": 20},
     "max_completion_tokens"),
    ({"model": MODEL, "messages": CHAT, "stream_options": {"include_usage": "lots"}},
     "stream_options.include_usage"),
    ({"model": MODEL, "messages": CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
    ({"model": MODEL, "messages": CHAT, "frobnicate": True}, "frobnicate"),
])
def test_chat_refusals_are_400_and_name_the_parameter(api, body, param):
    error = openai_error(api.post("/v1/chat/completions", json=body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL, "prompt": ["one", "two"]}, "prompt"),
    ({"model": MODEL, "prompt": "x", "echo": True}, "echo"),
    ({"model": MODEL, "prompt": "x", "best_of": 2}, "best_of"),
    ({"model": MODEL, "prompt": "x", "logprobs": 21}, "logprobs"),
])
def test_completion_refusals_are_400(api, body, param):
    assert openai_error(api.post("/v1/completions", json=body), 400)["param"] == param


def test_limits_map_to_openai_statuses(api):
    error = openai_error(api.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT,
                                                                "max_tokens": 100_000}), 400)
    assert "300" in error["message"]
    error = openai_error(api.post("/v1/completions", json={"model": MODEL, "prompt": "word " * 5000}), 400)
    assert error["code"] == "context_length_exceeded"
    error = openai_error(api.post("/v1/chat/completions", json={"model": "gpt-9", "messages": CHAT}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    error = openai_error(api.post("/v1/chat/completions", data=b"{", content_type="application/json"), 400)
    assert error["type"] == "invalid_request_error"


def test_redis_down_is_503_in_openai_shape(model_ref):
    app = create_app(make_settings(redis_url="redis://127.0.0.1:1/0"))
    resp = app.test_client().post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
    assert openai_error(resp, 503)["type"] == "server_error" and resp.headers["Retry-After"]


def test_jobs_api_validates_response_format_in_its_own_shape(api):
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 12}}}
    for response_format in (bad_schema, {"type": "json_schema", "json_schema": {"schema": {}, "x": 1}},
                            {"type": "json_object", "json_schema": {"schema": {}}}, {"type": "yaml"}):
        resp = api.post("/v1/jobs", json={"messages": CHAT, "response_format": response_format})
        assert resp.status_code == 422, resp.get_data(as_text=True)
        assert resp.get_json()["error"]["type"] == "validation_error"
        assert "response_format" in resp.get_json()["error"]["message"]


def test_models_lists_the_served_model_and_the_workers_with_a_fresh_heartbeat(api, settings):
    svc = api.application.extensions["llmq"]
    cold = api.get("/v1/models").get_json()["data"]  # served before any worker holds it: queued, not 404
    assert [(m["id"], m["llmq"]["state"], m["llmq"]["workers"]) for m in cold] == [(MODEL, "cold", [])]
    for name, model, alive in (("a", MODEL, True), ("b", MODEL, True), ("c", "Other-1B", False)):
        svc.redis.hset(svc.keys.workers, name, json.dumps({"name": name, "model": model}))
        if alive:
            svc.redis.set(svc.keys.worker_alive(name), "1", ex=30)
    try:
        listed = api.get("/v1/models").get_json()["data"]
        assert [m["id"] for m in listed] == [MODEL] and listed[0]["object"] == "model"
        assert listed[0]["llmq"]["state"] == "loaded" and listed[0]["llmq"]["workers"] == ["a", "b"]
        assert api.get(f"/v1/models/{MODEL}").get_json()["id"] == MODEL
        openai_error(api.get("/v1/models/Other-1B"), 404)
    finally:
        svc.redis.delete(svc.keys.workers, *(svc.keys.worker_alive(n) for n in "abc"))
