"""The API in front of a catalog of models (no worker: jobs stay queued): a request names any catalog
model, each model's own limits apply, an unknown one is 404, and every model shows its state."""
import json

from tests.support.metrics import parse_metrics, value
from tests.support.settings import settings_fixture

CHAT = [{"role": "user", "content": "Hello"}]


def catalog(tmp_path_factory):
    path = tmp_path_factory.mktemp("catalog") / "catalog.json"
    path.write_text(json.dumps({"models": {"smol": {"source": "embedded"},
                                           "short": {"source": "embedded", "max_tokens_cap": 16},
                                           "quoting": {"source": "embedded", "prompt_lookup": True}}}))
    return path


settings = settings_fixture(catalog=catalog)


def test_each_catalog_model_is_queued_under_its_name_with_its_own_limits(api):
    job = api.post("/v1/jobs", json={"messages": CHAT, "max_tokens": 100, "model": "smol"})
    assert job.status_code == 202 and job.get_json()["model"] == "smol"
    too_long = api.post("/v1/jobs", json={"messages": CHAT, "max_tokens": 100, "model": "short"})
    assert too_long.status_code == 422 and "at most 16" in too_long.get_json()["error"]["message"]
    default = api.post("/v1/jobs", json={"messages": CHAT, "max_tokens": 8})
    assert default.status_code == 202 and default.get_json()["model"] == "smol"  # the first is the default

    unknown = api.post("/v1/jobs", json={"messages": CHAT, "model": "SmolLM2-135M-Instruct"})
    assert unknown.status_code == 404 and unknown.get_json()["error"]["type"] == "model_not_found"
    openai = api.post("/v1/chat/completions", json={"messages": CHAT, "model": "gpt-4o"})
    assert openai.status_code == 404 and openai.get_json()["error"]["param"] == "model"

    cards = {m["id"]: m["llmq"] for m in api.get("/v1/models").get_json()["data"]}
    assert cards["smol"]["state"] == cards["short"]["state"] == "cold"
    assert (cards["smol"]["queued"], cards["short"]["queued"]) == (2, 0)
    assert api.get("/v1/models/short").get_json()["llmq"]["workers"] == []
    assert api.get("/ui/config").get_json()["models"] == ["smol", "short", "quoting"]
    samples = parse_metrics(api.get("/metrics").get_data(as_text=True))
    assert value(samples, "llmq_model_jobs", model="smol", state="queued") == 2
    assert value(samples, "llmq_model_loading", model="short") == 0


def test_a_request_may_name_only_its_models_own_prompt_lookup_setting(api):
    """Both engines that draft from the prompt build it into the pipeline: a request cannot
    switch it, so any other value is a 400 naming the parameter (on /v1/jobs and OpenAI routes)."""
    for model, same, other in (("smol", False, True), ("quoting", True, False)):
        job = api.post("/v1/jobs", json={"messages": CHAT, "max_tokens": 8, "model": model, "prompt_lookup": same})
        assert job.status_code == 202, job.get_json()
        refused = api.post("/v1/jobs", json={"messages": CHAT, "max_tokens": 8, "model": model, "prompt_lookup": other})
        error = refused.get_json()["error"]
        assert refused.status_code == 400 and error["param"] == "prompt_lookup", error
        assert f"model {model!r} is served with prompt lookup {'on' if same else 'off'}" in error["message"]
    chat = api.post("/v1/chat/completions", json={"messages": CHAT, "model": "smol", "prompt_lookup": True})
    assert chat.status_code == 400 and chat.get_json()["error"]["param"] == "prompt_lookup"
    response = api.post("/v1/responses", json={"input": "Hello", "model": "smol", "prompt_lookup": True})
    assert response.status_code == 400 and response.get_json()["error"]["param"] == "prompt_lookup"
    accepted = api.post("/v1/chat/completions", json={"messages": CHAT, "model": "quoting", "max_tokens": 4,
                                                      "prompt_lookup": True, "stream": True})
    assert accepted.status_code == 200
    accepted.close()


def test_a_model_being_loaded_shows_who_loads_it(api):
    svc = api.application.extensions["llmq"]
    assert svc.model_loads.lock("short", "host:1", ttl_s=30)
    assert not svc.model_loads.lock("short", "host:2", ttl_s=30)  # one loader at a time
    try:
        card = api.get("/v1/models/short").get_json()["llmq"]
        assert (card["state"], card["loading_by"]) == ("loading", "host:1")
        assert value(parse_metrics(api.get("/metrics").get_data(as_text=True)), "llmq_model_loading",
                     model="short") == 1
    finally:
        svc.model_loads.unlock("short", "host:2")  # not its lock: nothing happens
        assert svc.model_loads.loading(["short"]) == {"short": "host:1"}
        svc.model_loads.unlock("short", "host:1")
    assert api.get("/v1/models/short").get_json()["llmq"]["state"] == "cold"
