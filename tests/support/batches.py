"""Batches over HTTP: input files (JSONL lines), uploading, creating, waiting for and reading the
results of a batch."""
from __future__ import annotations

import json

import requests

from tests.support.waiting import wait_until


MODEL = "SmolLM2-135M-Instruct"


def chat_line(custom_id: str, content: str, max_tokens: int = 8, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": content}],
                     "max_tokens": max_tokens, **body}}


def jsonl(lines: list) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def upload(base: str, lines: list, headers: dict | None = None) -> str:
    resp = requests.post(f"{base}/v1/files", data={"purpose": "batch"}, headers=headers or {},
                         files={"file": ("in.jsonl", jsonl(lines))}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()["id"]


def create_batch(base: str, file_id: str, headers: dict | None = None) -> dict:
    resp = requests.post(f"{base}/v1/batches", headers=headers or {}, timeout=30, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert resp.status_code == 200, resp.text
    return resp.json()


def wait_batch(base: str, batch_id: str, timeout: float = 240, until=("completed", "failed", "expired", "cancelled")) -> dict:
    """The batch once its status is one of `until`, read through restarts of the API or Redis."""
    last = {}  # the state read last, for the failure's message

    def ended() -> dict | None:
        last["state"] = state = requests.get(f"{base}/v1/batches/{batch_id}", timeout=10).json()
        return state if state.get("status") in until else None
    return wait_until(ended, timeout, interval=0.5, ignoring=(requests.RequestException, ValueError),
                      message=lambda: f"batch {batch_id} did not end: {last.get('state')}")


def results(base: str, state: dict) -> tuple[list[dict], list[dict]]:
    """(output lines, error lines) of an ended batch."""
    out = []
    for key in ("output_file_id", "error_file_id"):
        lines = []
        if state.get(key):
            text = requests.get(f"{base}/v1/files/{state[key]}/content", timeout=30).text
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        out.append(lines)
    return out[0], out[1]
