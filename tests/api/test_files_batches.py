"""Files and Batch APIs on the real Redis without a model worker: uploads and their limits,
batch creation errors, validation failures with line numbers, cancel and expiry with every line
accounted for, ownership between keys, and batch lines kept out of the interactive queue bound.
Batch steps run in-process (worker/batch_runner.py), as a control worker's task would run them."""
import io
import json
import time

from hypothesis import given
from hypothesis import strategies as st

from api import create_app
from common.api_keys import hash_key
from common.batches import line_job_id
from common.files import count_lines
from tests.support.batches import chat_line, jsonl
from tests.support.settings import cleanup_namespace, make_settings, settings_fixture
from worker.batch_runner import BatchRunner

KEYS = {"alice": "alice-secret", "bob": "bob-secret"}


# A fresh namespace per test (no files, batches or jobs of another test). max_body_bytes below
# file_max_bytes: uploads have their own limit, other bodies keep theirs.
settings = settings_fixture(scope="function", file_max_bytes=40_000, file_max_lines=30, batch_window_s=3600,
                            max_queue=5, max_tokens_cap=64, max_body_bytes=10_000)


def upload(client, lines, purpose="batch", headers=None, name="in.jsonl"):
    data = lines if isinstance(lines, bytes) else jsonl(lines)
    return client.post("/v1/files", headers=headers or {}, content_type="multipart/form-data",
                       data={"purpose": purpose, "file": (io.BytesIO(data), name)})


def create(client, file_id, headers=None, **extra):
    return client.post("/v1/batches", headers=headers or {}, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **extra})


def assert_openai_error(resp, status, param=None):
    assert resp.status_code == status, resp.get_json()
    error = resp.get_json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param:
        assert error["param"] == param
    return error


def test_file_upload_list_retrieve_content_delete(api):
    client = api
    lines = [chat_line("a", "Hi"), chat_line("b", "Yo")]
    file = upload(client, lines).get_json()
    assert set(file) >= {"id", "object", "bytes", "created_at", "filename", "purpose", "expires_at"}
    assert file["object"] == "file" and file["purpose"] == "batch" and file["filename"] == "in.jsonl"
    assert file["bytes"] == len(jsonl(lines)) and file["expires_at"] > file["created_at"]
    assert client.get(f"/v1/files/{file['id']}").get_json() == file
    assert client.get(f"/v1/files/{file['id']}/content").data == jsonl(lines)
    listed = client.get("/v1/files").get_json()
    assert listed["object"] == "list" and [f["id"] for f in listed["data"]] == [file["id"]]
    assert client.delete(f"/v1/files/{file['id']}").get_json() == {"id": file["id"], "object": "file", "deleted": True}
    for path in (f"/v1/files/{file['id']}", f"/v1/files/{file['id']}/content"):
        assert_openai_error(client.get(path), 404)
    assert_openai_error(client.delete(f"/v1/files/{file['id']}"), 404)


def test_file_limits_and_bad_uploads(api):
    client = api
    assert "40000 bytes" in assert_openai_error(upload(client, b"x" * 40_001), 413, "file")["message"]
    assert upload(client, b"{}\n" * 5 + b" " * 20_000).status_code == 200  # above max_body_bytes
    assert client.post("/v1/jobs", json={"prompt": "x" * 20_000}).status_code == 413  # which still holds
    many = upload(client, b"".join(b"{}\n" for _ in range(31)))
    assert "at most 30" in assert_openai_error(many, 413, "file")["message"]
    assert_openai_error(upload(client, [chat_line("a", "Hi")], purpose="fine-tune"), 400, "purpose")
    assert_openai_error(upload(client, b"\xff\xfe not utf-8"), 400, "file")
    assert_openai_error(client.post("/v1/files", data={"purpose": "batch"}), 400, "file")
    assert len(client.get("/v1/files").get_json()["data"]) == 1  # only the good upload was stored


def test_batch_create_errors(api):
    client, svc = api, api.services
    file_id = upload(client, [chat_line("a", "Hi")]).get_json()["id"]
    assert_openai_error(create(client, file_id, endpoint="/v1/embeddings"), 400, "endpoint")
    assert_openai_error(create(client, file_id, completion_window="1h"), 400, "completion_window")
    assert_openai_error(create(client, "file-nope"), 404)
    assert_openai_error(create(client, file_id, webhook="ftp://example.com/x"), 400, "webhook")
    assert_openai_error(create(client, file_id, metadata={str(i): "x" for i in range(17)}), 400, "metadata")
    assert_openai_error(client.post("/v1/batches", data="{", content_type="application/json"), 400)
    output = svc.files.create(None, "out.jsonl", "batch_output", "{}\n")
    assert_openai_error(create(client, output["id"]), 400, "input_file_id")
    assert_openai_error(client.get("/v1/batches/batch_nope"), 404)
    assert_openai_error(client.post("/v1/batches/batch_nope/cancel"), 404)
    assert client.get("/v1/batches").get_json()["data"] == []
    # a webhook follows the job webhooks' address rules (these tests allow loopback, nothing private)
    assert_openai_error(create(client, file_id, webhook="http://10.0.0.1/hook"), 400, "webhook")
    ok = create(client, file_id, metadata={"k": "v"}, webhook="http://127.0.0.1:9/hook").get_json()
    assert ok["status"] == "validating" and ok["metadata"] == {"k": "v"}
    assert ok["webhook"]["url"] == "http://127.0.0.1:9/hook" and ok["webhook"]["state"] == "waiting"
    assert ok["expires_at"] - ok["created_at"] in (3600, 3601)  # whole seconds: the window rounded up


def test_a_bad_file_fails_validation_with_line_numbers_and_queues_nothing(api):
    client, svc = api, api.services
    lines = [chat_line("ok", "Hi"), "{not json", chat_line("ok", "dup"),
             {**chat_line("u", "Hi"), "url": "/v1/embeddings"},
             chat_line("s", "Hi", stream=True), chat_line("long", "word " * 4500),
             chat_line("n", "Hi", n=2), {**chat_line("m", "Hi"), "method": "GET"}]
    file_id = upload(client, lines).get_json()["id"]
    batch = create(client, file_id).get_json()
    assert BatchRunner(svc.admission).advance(batch["id"])
    state = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert state["status"] == "failed" and state["failed_at"]
    errors = {e["line"]: e for e in state["errors"]["data"]}
    assert sorted(errors) == [2, 3, 4, 5, 6, 7, 8]
    assert errors[2]["code"] == "invalid_json_line"
    assert errors[3]["code"] == "duplicate_custom_id"
    assert errors[4]["code"] == "invalid_url" and errors[4]["param"] == "url"
    assert errors[5]["param"] == "body.stream"
    assert errors[6]["code"] == "context_length_exceeded"
    assert errors[7]["param"] == "body.n"
    assert errors[8]["code"] == "invalid_method"
    assert svc.redis.zcard(svc.keys.queued) == 0 and svc.jobs.get(line_job_id(batch["id"], 1)) is None
    assert_openai_error(client.post(f"/v1/batches/{batch['id']}/cancel"), 409)


def run_to_in_progress(client, svc, n):
    file_id = upload(client, [chat_line(f"c{i}", f"Count to {i}") for i in range(n)]).get_json()["id"]
    batch = create(client, file_id).get_json()
    assert not BatchRunner(svc.admission).advance(batch["id"])
    state = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert state["status"] == "in_progress" and state["request_counts"]["total"] == n and state["in_progress_at"]
    return batch["id"]


def ended_lines(client, svc, batch_id):
    state = client.get(f"/v1/batches/{batch_id}").get_json()
    assert state["output_file_id"] is None
    text = client.get(f"/v1/files/{state['error_file_id']}/content").data.decode()
    return state, [json.loads(line) for line in text.splitlines()]


def test_batch_lines_wait_below_interactive_jobs_and_outside_the_queue_bound(api):
    client, svc = api, api.services
    batch_id = run_to_in_progress(client, svc, 8)  # more lines than max_queue (5)
    job = svc.jobs.get(line_job_id(batch_id, 1))
    assert job["status"] == "queued" and job["priority"] == "batch"
    resp = client.post("/v1/jobs", json={"prompt": "Hi", "max_tokens": 4, "priority": "low", "cache": False})
    assert resp.status_code == 202, resp.get_json()  # the batch's 8 lines do not fill the bound
    assert resp.get_json()["queue_position"] == 1  # next: ahead of all of them
    picked = svc.jobs.fair.pick(job["queue"], "ticket-1").job_id
    assert picked == resp.get_json()["id"]


def test_cancel_accounts_for_every_line_as_batch_cancelled(api, monkeypatch):
    client, svc = api, api.services
    ended = []
    monkeypatch.setattr("worker.batch_runner.on_batch_ended", lambda webhooks, batch: ended.append(batch))
    batch_id = run_to_in_progress(client, svc, 6)
    cancelling = client.post(f"/v1/batches/{batch_id}/cancel").get_json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"]
    assert client.post(f"/v1/batches/{batch_id}/cancel").get_json()["status"] == "cancelling"
    assert BatchRunner(svc.admission).advance(batch_id)
    state, lines = ended_lines(client, svc, batch_id)
    assert state["status"] == "cancelled" and state["cancelled_at"]
    assert state["request_counts"] == {"total": 6, "completed": 0, "failed": 6}
    assert sorted(line["custom_id"] for line in lines) == sorted(f"c{i}" for i in range(6))
    assert {line["error"]["code"] for line in lines} == {"batch_cancelled"}
    assert svc.jobs.get(line_job_id(batch_id, 1))["status"] == "cancelled"
    assert_openai_error(client.post(f"/v1/batches/{batch_id}/cancel"), 409)
    assert BatchRunner(svc.admission).advance(batch_id)  # a step too many changes nothing
    assert [b["status"] for b in ended] == ["cancelled"]  # the webhook hook, called once


def test_an_ended_batch_queues_one_signed_event_for_its_webhook(api):
    client, svc = api, api.services
    file_id = upload(client, [chat_line("a", "Hi"), chat_line("b", "Yo")]).get_json()["id"]
    batch_id = create(client, file_id, webhook="http://127.0.0.1:9/hook").get_json()["id"]
    BatchRunner(svc.admission).advance(batch_id)
    client.post(f"/v1/batches/{batch_id}/cancel")
    assert BatchRunner(svc.admission).advance(batch_id) and BatchRunner(svc.admission).advance(batch_id)
    (delivery,) = svc.webhooks.deliveries(batch_id)  # once, however many steps ran after the end
    assert delivery["type"] == "batch.cancelled"
    body = json.loads(svc.webhooks.get(delivery["id"])["body"])
    assert body["data"]["id"] == batch_id and body["data"]["request_counts"]["failed"] == 2
    shown = client.get(f"/v1/batches/{batch_id}").get_json()["webhook"]
    assert shown["deliveries"][0]["id"] == delivery["id"] and shown["state"] in ("pending", "failed")


def test_a_batch_past_its_window_expires_with_batch_expired_lines(model_ref):
    settings = make_settings(batch_window_s=1)
    app = create_app(settings)
    client, svc = app.test_client(), app.extensions["llmq"]
    try:
        file_id = upload(client, [chat_line(f"c{i}", "Hi") for i in range(3)]).get_json()["id"]
        before = time.time()
        created = create(client, file_id).get_json()
        batch_id = created["id"]
        assert created["expires_at"] >= before + 1  # whole seconds, yet never less than the window
        assert not BatchRunner(svc.admission).advance(batch_id)
        time.sleep(max(0.0, created["expires_at"] - time.time()) + 0.2)  # the behaviour: the window runs out
        assert BatchRunner(svc.admission).advance(batch_id)
        state, lines = ended_lines(client, svc, batch_id)
        assert state["status"] == "expired" and state["expired_at"]
        assert state["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
        assert {line["error"]["code"] for line in lines} == {"batch_expired"} and len(lines) == 3
    finally:
        cleanup_namespace(settings)


def test_keys_see_only_their_own_files_and_batches(model_ref):
    entries = ",".join(f"{name}:{hash_key(secret)}" for name, secret in KEYS.items())
    settings = make_settings(api_keys=entries)
    app = create_app(settings)
    client = app.test_client()
    alice, bob = ({"Authorization": f"Bearer {KEYS[n]}"} for n in ("alice", "bob"))
    try:
        file_id = upload(client, [chat_line("a", "Hi")], headers=alice).get_json()["id"]
        batch_id = create(client, file_id, headers=alice).get_json()["id"]
        for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content", f"/v1/batches/{batch_id}"):
            assert client.get(path, headers=alice).status_code == 200
            assert_openai_error(client.get(path, headers=bob), 404)
        assert_openai_error(create(client, file_id, headers=bob), 404)
        assert_openai_error(client.post(f"/v1/batches/{batch_id}/cancel", headers=bob), 404)
        assert_openai_error(client.delete(f"/v1/files/{file_id}", headers=bob), 404)
        assert client.get("/v1/files", headers=bob).get_json()["data"] == []
        assert client.get("/v1/batches", headers=bob).get_json()["data"] == []
        assert [b["id"] for b in client.get("/v1/batches", headers=alice).get_json()["data"]] == [batch_id]
        assert client.get(f"/v1/batches/{batch_id}", headers=alice).get_json()["status"] == "validating"
        assert client.get("/v1/files").status_code == 401
    finally:
        cleanup_namespace(settings)


def test_watchdog_kicks_only_stalled_batches_and_replaces_their_chain(api):
    from worker.batch_tasks import watchdog_pass

    client, svc = api, api.services
    batch_id = create(client, upload(client, [chat_line("a", "Hi")]).get_json()["id"]).get_json()["id"]
    tick_key = svc.keys.batch_part(batch_id, "tick")
    first = svc.redis.get(tick_key)
    assert first  # the API scheduled the first step
    svc.batches.update(batch_id, advanced_at=time.time())
    assert watchdog_pass(svc) == []
    svc.batches.update(batch_id, advanced_at=time.time() - 60)  # its chain broke a minute ago
    assert watchdog_pass(svc) == [batch_id]
    assert svc.redis.get(tick_key) not in (None, first)  # the old chain's next step will do nothing
    assert BatchRunner(svc.admission).advance(batch_id) is False and watchdog_pass(svc) == []


def test_a_stalled_batch_tops_up_the_tickets_of_its_queued_lines(api):
    client, svc = api, api.services
    batch_id = run_to_in_progress(client, svc, 3)
    queue = svc.jobs.get(line_job_id(batch_id, 1))["queue"]
    tickets = lambda: sum(svc.redis.llen(key) for key in svc.keys.broker_lists(queue))
    before = tickets()
    assert before == 3  # one per line
    assert not BatchRunner(svc.admission).advance(batch_id) and tickets() == before  # not stalled yet
    svc.batches.update(batch_id, in_progress_at=int(time.time()) - 60)  # nothing ended for a minute
    assert not BatchRunner(svc.admission).advance(batch_id)
    assert tickets() == before + 3 and svc.batches.get(batch_id)["topped_up_at"]
    assert not BatchRunner(svc.admission).advance(batch_id) and tickets() == before + 3  # once per stall period


@given(st.lists(st.tuples(st.sampled_from(["", " ", "\t", "x", "{} ", " a b"]),
                          st.sampled_from(["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028",
                                           " \n", "\t\r\n"])), max_size=40),
       st.sampled_from(["", "z", " "]))
def test_line_count_is_the_runners_count_of_non_blank_lines(pieces, tail):
    """The upload's count (read in slices, for a large file) agrees with how the batch runner
    splits the file into requests."""
    content = "".join(text + sep for text, sep in pieces) + tail
    assert count_lines(content) == sum(1 for line in content.splitlines() if line.strip())


def test_line_count_stops_past_the_limit_and_spans_slices():
    content = "x\n" * 1_500_000  # 3 MB: three slices
    assert count_lines(content) == 1_500_000
    assert 50_000 < count_lines(content, most=50_000) < 1_500_000
