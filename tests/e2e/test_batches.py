"""Batches on the live stack (API on a socket, a real model worker, a real control worker): the
`openai` client's Files and Batches calls unchanged, and the `llmq` command in a subprocess."""
import json
import os
import subprocess
import sys

import openai
import pytest

from tests.support import ROOT
from tests.support.batches import MODEL, chat_line, jsonl, results, upload, wait_batch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(live_api, control_worker):
    return live_api


@pytest.fixture
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def test_openai_client_files_and_batches(base, client, tmp_path):
    lines = [chat_line(f"q{i}", f"Name a colour, {i}.", max_tokens=6, temperature=0) for i in range(12)]
    lines.append({"custom_id": "legacy-shape", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                           "max_completion_tokens": 6, "seed": 7}})
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl(lines))
    file = client.files.create(file=path.open("rb"), purpose="batch")
    assert file.purpose == "batch" and file.bytes == path.stat().st_size
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "e2e"})
    assert batch.status == "validating" and batch.metadata == {"run": "e2e"}
    assert batch.id in [b.id for b in client.batches.list(limit=100).data]
    wait_batch(base, batch.id)
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.total == batch.request_counts.completed == 13
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.usage.output_tokens > 0 and batch.error_file_id is None
    output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in output) == sorted(line["custom_id"] for line in lines)
    for line in output:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
        assert body["id"] == f"chatcmpl-{line['response']['request_id']}"
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_unknown")


def test_openai_client_cancel_keeps_finished_lines_and_accounts_for_the_rest(base, client):
    lines = [chat_line(f"c{i}", f"Write a long story number {i}.", max_tokens=200) for i in range(40)]
    file_id = upload(base, lines)
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_batch(base, batch.id, until=("in_progress",))
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelling"
    state = wait_batch(base, batch.id)
    assert state["status"] == "cancelled" and state["cancelled_at"]
    output, errors = results(base, state)
    ids = [line["custom_id"] for line in output + errors]
    assert sorted(ids) == sorted(f"c{i}" for i in range(40))  # each exactly once
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert state["request_counts"] == {"total": 40, "completed": len(output), "failed": len(errors)}
    assert len(errors) > 0


def llmq(base, *args, timeout=240):
    return subprocess.run([sys.executable, "-m", "llmq_cli", "--api-url", base, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if not k.startswith("LLMQ_")})


def test_llmq_command(base, tmp_path):
    lines = [chat_line(f"k{i}", f"Say {i}", max_tokens=4) for i in range(5)]
    (tmp_path / "in.jsonl").write_bytes(jsonl(lines))
    run = llmq(base, "batch", "run", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"))
    assert run.returncode == 0, run.stderr
    assert "completed: 5 succeeded, 0 failed" in run.stderr and "5/5" in run.stderr  # the progress bar
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in out] == [f"k{i}" for i in range(5)]  # input order
    batch_id = run.stderr.split()[1].rstrip(":")
    status = llmq(base, "batch", "status", batch_id)
    assert status.returncode == 0 and json.loads(status.stdout)["status"] == "completed"
    assert batch_id in llmq(base, "batch", "list").stdout
    cancel = llmq(base, "batch", "cancel", batch_id)
    assert cancel.returncode == 2 and "Cannot cancel" in cancel.stderr

    answer = llmq(base, "submit", "Say hello", "--max-tokens", "8")
    assert answer.returncode == 0 and answer.stdout.strip(), answer.stderr

    (tmp_path / "bad.jsonl").write_text('{"custom_id": "a"}\n')
    bad = llmq(base, "batch", "run", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "x.jsonl"))
    assert bad.returncode == 2 and "bad.jsonl:1" in bad.stderr
    dup = [chat_line("same", "Hi"), chat_line("same", "Ho")]
    (tmp_path / "dup.jsonl").write_bytes(jsonl(dup))
    failed = llmq(base, "batch", "run", str(tmp_path / "dup.jsonl"), "-o", str(tmp_path / "x.jsonl"))
    assert failed.returncode == 2 and "line 2: duplicate_custom_id" in failed.stderr
    down = llmq("http://127.0.0.1:9", "batch", "list")
    assert down.returncode == 3 and "cannot reach" in down.stderr
