"""The API's /metrics: Prometheus text that parses, with queue depth, jobs by status, cache
lookups and request counts read from the real Redis (no worker: jobs stay queued)."""

import logging

import requests

from api import create_app
from tests.support.metrics import parse_metrics, value
from tests.support.ports import free_port
from tests.support.settings import make_settings

CHAT = [{"role": "user", "content": "Hello there"}]


def scrape(client) -> dict:
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.content_type.startswith("text/plain")
    return parse_metrics(resp.get_data(as_text=True))


def test_queue_depth_jobs_by_status_cache_and_requests(api):
    client, settings = api, api.settings
    before = scrape(client)
    queue = f"{settings.namespace}.smollm2-135m-instruct"
    assert value(before, "llmq_queue_depth", queue=queue) == 0
    assert value(before, "llmq_redis_up") == 1

    ids = [client.post("/v1/jobs", json={"messages": CHAT, "max_tokens": 8, "temperature": 0,
                                         "seed": n}).get_json()["id"] for n in range(3)]
    client.post("/v1/jobs", json={"messages": CHAT, "temperature": 0.7})  # not cacheable: no lookup
    client.post("/v1/jobs", json={"messages": []})  # 422
    assert client.delete(f"/v1/jobs/{ids[0]}").status_code == 200

    after = scrape(client)
    assert value(after, "llmq_queue_depth", queue=queue) == 4  # messages wait in the broker
    assert value(after, "llmq_jobs", status="queued") == 3  # the cancelled one left the queue
    assert value(after, "llmq_jobs_finished_total", status="cancelled") == 1
    assert value(after, "llmq_cache_lookups_total", result="miss") == 3
    assert value(after, "llmq_cache_lookups_total", result="hit") == 0
    assert value(after, "llmq_http_requests_total", method="POST", endpoint="jobs.create_job", status="202") == 4
    assert value(after, "llmq_http_requests_total", method="POST", endpoint="jobs.create_job", status="422") == 1
    assert value(after, "llmq_http_request_duration_seconds_count", endpoint="jobs.create_job") == 5
    assert value(after, "llmq_workers_live") == 0


def test_metrics_answer_with_redis_down(model_ref):
    client = create_app(make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")).test_client()
    samples = scrape(client)
    assert value(samples, "llmq_redis_up") == 0
    assert client.get("/v1/jobs/x").status_code == 503  # and the request was still counted
    assert value(scrape(client), "llmq_http_requests_total", method="GET", endpoint="jobs.get_job",
                 status="503") == 1


def test_the_access_log_names_the_job_each_request_created_or_read(api, caplog):
    base = api.serve()  # streams as a client reads them: headers, then it leaves (no worker runs the jobs)
    model = requests.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
    caplog.set_level(logging.INFO, logger="api.access")
    queued = requests.post(f"{base}/v1/jobs", json={"messages": CHAT, "temperature": 0.7}, timeout=10).json()["id"]
    with requests.post(f"{base}/v1/jobs", json={"messages": CHAT, "temperature": 0.7, "stream": True},
                       stream=True, timeout=10) as response:
        streamed = response.headers["X-Job-Id"]
    with requests.post(f"{base}/v1/chat/completions", json={"model": model, "messages": CHAT, "stream": True},
                       stream=True, timeout=10) as response:
        chat = response.headers["X-LLMQ-Job-Id"]
    requests.get(f"{base}/v1/jobs/{queued}", timeout=10)
    requests.post(f"{base}/v1/jobs", json={"messages": []}, timeout=10)
    logged = [(r.path, r.status, getattr(r, "job_id", None)) for r in caplog.records if r.name == "api.access"]
    assert logged == [("/v1/jobs", 202, queued), ("/v1/jobs", 200, streamed), ("/v1/chat/completions", 200, chat),
                      (f"/v1/jobs/{queued}", 200, queued), ("/v1/jobs", 422, None)]
