"""The Responses API over jobs, without a worker (real Redis): response objects and events as the
openai SDK types them, ownership by API key, cancel of a queued response, input_items pages, and
events numbered the same by every API process, whatever part of the log it reads from."""
import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from api import create_app
from common.api_keys import hash_key
from common.schemas import JobStatus
from tests.support.jobs import end_as_a_worker, log_as_a_worker
from tests.support.settings import settings_fixture

MODEL = "SmolLM2-135M-Instruct"
KEYS = {"alice": "alice-secret-key", "bob": "bob-secret-key"}
EVENT = TypeAdapter(ResponseStreamEvent)


def bearer(name):
    return {"Authorization": f"Bearer {KEYS[name]}"}


settings = settings_fixture(api_keys=",".join(f"{name}:{hash_key(key)}" for name, key in KEYS.items()))


def create(api, who="alice", **body):
    reply = api.post("/v1/responses", json={"model": MODEL, "input": "Hello", "background": True, "cache": False,
                                            **body}, headers=bearer(who))
    assert reply.status_code == 200, reply.get_data(as_text=True)
    return reply.get_json()


def test_a_background_response_is_queued_and_typed_as_the_sdk_expects(api):
    created = create(api, instructions="Be brief.", metadata={"run": "7"}, max_output_tokens=12)
    response = Response.model_validate(created)  # the SDK's own model, strictly validated
    assert response.status == "queued" and response.background and response.instructions == "Be brief."
    assert response.metadata == {"run": "7"} and response.max_output_tokens == 12 and response.output == []
    job = api.get(f"/v1/jobs/{created['id'].removeprefix('resp_')}", headers=bearer("alice")).get_json()
    assert job["status"] == "queued"  # a response is a job


def test_another_keys_response_is_not_found_anywhere(api):
    created = create(api)
    for reply in (api.get(f"/v1/responses/{created['id']}", headers=bearer("bob")),
                  api.post(f"/v1/responses/{created['id']}/cancel", headers=bearer("bob")),
                  api.get(f"/v1/responses/{created['id']}/input_items", headers=bearer("bob")),
                  api.delete(f"/v1/responses/{created['id']}", headers=bearer("bob")),
                  api.post("/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": created["id"]},
                           headers=bearer("bob"))):
        assert reply.status_code == 404, reply.get_data(as_text=True)
    assert api.get(f"/v1/responses/{created['id']}", headers=bearer("alice")).status_code == 200
    # a plain job is no response
    job = api.post("/v1/jobs", json={"prompt": "x"}, headers=bearer("alice")).get_json()
    assert api.get(f"/v1/responses/resp_{job['id']}", headers=bearer("alice")).status_code == 404


def test_cancel_a_queued_background_response(api):
    created = create(api)
    cancelled = api.post(f"/v1/responses/{created['id']}/cancel", headers=bearer("alice"))
    assert cancelled.status_code == 200 and cancelled.get_json()["status"] == "cancelled"
    again = api.post(f"/v1/responses/{created['id']}/cancel", headers=bearer("alice"))
    assert again.status_code == 200 and again.get_json()["status"] == "cancelled"


def test_input_items_are_paged_newest_first(api):
    items = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    created = create(api, input=items)
    url = f"/v1/responses/{created['id']}/input_items"
    page = api.get(f"{url}?limit=2", headers=bearer("alice")).get_json()
    assert [i["content"][0]["text"] for i in page["data"]] == ["message 4", "message 3"] and page["has_more"]
    rest = api.get(f"{url}?limit=10&after={page['last_id']}", headers=bearer("alice")).get_json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["message 2", "message 1", "message 0"]
    assert not rest["has_more"] and len({i["id"] for i in page["data"] + rest["data"]}) == 5
    ascending = api.get(f"{url}?order=asc&limit=1", headers=bearer("alice")).get_json()
    assert ascending["data"][0]["content"][0]["text"] == "message 0"
    for bad in ("limit=0", "limit=x", "order=sideways"):
        assert api.get(f"{url}?{bad}", headers=bearer("alice")).status_code == 400


def test_events_are_numbered_the_same_however_the_log_is_read(api, settings):
    """Two API processes (two apps) read the same log: one from the start, one resuming after
    event N; the resumed events are exactly the tail of the full replay."""
    created = create(api, tools=[{"type": "function", "name": "get_time", "parameters": {"type": "object"}}])
    job_id = created["id"].removeprefix("resp_")
    svc = api.services
    svc.jobs.r.hset(svc.jobs.keys.job(job_id), mapping={"status": "running"})  # as if a worker took it
    for piece in ("The time", " is: ", "<tool_call>", '{"name": "get_time", "arguments": {}}', "</tool_call>"):
        svc.token_log.append_event(job_id, "chunk", {"index": 0, "text": piece})
    svc.jobs.finish(job_id, JobStatus.SUCCEEDED, text='The time is: <tool_call>{"name": "get_time", '
                     '"arguments": {}}</tool_call>', finish_reason="stop", completion_tokens=9)
    svc.token_log.publish_done(job_id)

    def events(app, after=None):
        query = "?stream=true" + (f"&starting_after={after}" if after is not None else "")
        body = app.test_client().get(f"/v1/responses/{created['id']}{query}", headers=bearer("alice"))
        return [EVENT.validate_python(json.loads(line[6:])) for line in body.get_data(as_text=True).splitlines()
                if line.startswith("data: ")]

    whole = events(create_app(settings))
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    assert [e.type for e in whole][:3] == ["response.created", "response.queued", "response.in_progress"]
    assert whole[-1].type == "response.completed"
    [message, call] = whole[-1].response.output
    assert message.content[0].text == "The time is:" and call.name == "get_time" and call.arguments == "{}"
    resumed = events(create_app(settings), after=6)
    assert [e.model_dump() for e in resumed] == [e.model_dump() for e in whole[7:]]


def test_logprobs_with_tools_are_refused_naming_the_parameter(api):
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    for extra, param in (({"top_logprobs": 2}, "top_logprobs"), ({"include": ["message.output_text.logprobs"]},
                                                                  "include")):
        reply = api.post("/v1/responses", json={"model": MODEL, "input": "x", "tools": [tool], **extra},
                         headers=bearer("alice"))
        assert reply.status_code == 400 and reply.get_json()["error"]["param"] == param
    reply = api.post("/v1/responses", json={"model": MODEL, "input": "x", "top_logprobs": 21}, headers=bearer("alice"))
    assert reply.status_code == 400 and reply.get_json()["error"]["param"] == "top_logprobs"


def _logged_response(api, pieces, final_text, **body):
    """A response whose job's log holds `pieces` (strings are chunks, None a restart), then ends
    with `final_text`, as if a worker had run it."""
    created = create(api, **body)
    job_id = created["id"].removeprefix("resp_")
    log_as_a_worker(api.services, job_id, pieces)
    end_as_a_worker(api.services, job_id, final_text)
    return created["id"]


def _stream_lines(api, response_id, after=None):
    query = "?stream=true" + (f"&starting_after={after}" if after is not None else "")
    body = api.get(f"/v1/responses/{response_id}{query}", headers=bearer("alice")).get_data(as_text=True)
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.mark.parametrize("pieces, final", [
    # a forced call shows nothing before its end: the new attempt just goes on
    (['[{"name": "get_weather", ', None, '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'],
     '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'),
])
def test_a_restarted_forced_call_goes_on_unseen(api, pieces, final):
    rid = _logged_response(api, pieces, final, tools=[WEATHER], tool_choice="required")
    events = [EVENT.validate_python(e) for e in _stream_lines(api, rid)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    [call] = events[-1].response.output
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}


def test_a_restarted_answer_that_says_the_same_again_goes_on_seamlessly(api):
    pieces = ['{"ci', 'ty": "Pa', None, '{"city"', ': "Pa', 'ris"}']
    rid = _logged_response(api, pieces, '{"city": "Paris"}', tools=[WEATHER],
                           tool_choice={"type": "function", "name": "get_weather"})
    events = [EVENT.validate_python(e) for e in _stream_lines(api, rid)]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == '{"city": "Paris"}' and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    tail = [EVENT.validate_python(e) for e in _stream_lines(api, rid, after=5)]
    assert [e.model_dump() for e in tail] == [e.model_dump() for e in events[6:]]


def test_a_restarted_answer_that_says_otherwise_ends_the_stream_with_an_error(api):
    rid = _logged_response(api, ["Hello wor", None, "Hi there"], "Hi there")
    lines = _stream_lines(api, rid)
    assert lines[-1]["type"] == "error" and lines[-1]["code"] == "worker_lost"
    assert "".join(e["delta"] for e in lines if e["type"] == "response.output_text.delta") == "Hello wor"
    assert api.get(f"/v1/responses/{rid}", headers=bearer("alice")).get_json()["output"][0]["content"][0][
        "text"] == "Hi there"  # the response itself has its new answer
