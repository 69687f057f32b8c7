"""A job through the jobs API over HTTP (a live server): submit it, read its event stream."""
from __future__ import annotations

import requests

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
