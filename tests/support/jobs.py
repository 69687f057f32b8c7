"""A job through the jobs API over HTTP (a live server): submit it, read its event stream; or a
job's log and end written as its worker would, for API tests without a worker."""
from __future__ import annotations

import requests

from common.schemas import JobStatus
from common.sseclient import iter_sse


def submit(base, **body):
    body.setdefault("cache", False)
    resp = requests.post(f"{base}/v1/jobs", json=body, timeout=30)
    assert resp.status_code == 202, resp.text
    return resp.json()


def read_stream(base, job_id, last_event_id=None, stop_after=None):
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events = []
    with requests.get(f"{base}/v1/jobs/{job_id}/events", headers=headers, stream=True, timeout=120) as resp:
        assert resp.status_code == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["X-Accel-Buffering"] == "no"
        for event in iter_sse(resp.iter_lines(chunk_size=None)):
            events.append(event)
            if event.event == "done" or (stop_after and len(events) >= stop_after):
                break
    return events


def chunks_text(events):
    return "".join(e.json()["text"] for e in events if e.event == "chunk")


def log_as_a_worker(svc, job_id, pieces):
    """Write `pieces` to a job's log as its worker(s) would: a string is a chunk, None a `restart`
    (the worker was lost and the job started over)."""
    svc.jobs.r.hset(svc.jobs.keys.job(job_id), mapping={"status": "running"})
    for piece in pieces:
        if piece is None:
            svc.token_log.append_event(job_id, "restart", {"reason": "the worker was lost; its job cannot continue"})
        else:
            svc.token_log.append_event(job_id, "chunk", {"index": 0, "text": piece})


def end_as_a_worker(svc, job_id, text):
    """End a job as its worker would, with `text` as its whole answer."""
    svc.jobs.finish(job_id, JobStatus.SUCCEEDED, text=text, finish_reason="stop", completion_tokens=9)
    svc.token_log.publish_done(job_id)
