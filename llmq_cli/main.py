"""`llmq batch run|status|cancel|list` and `llmq submit`, against llmq's OpenAI-compatible API;
`llmq tune`, on a worker host, measures which engine serves a model fastest there.

Exit codes: 0 done (every line of a batch succeeded); 1 the batch ended with failed lines, or as
failed / expired / cancelled; 2 bad usage or a bad input file; 3 the API is unreachable or
answered an error; 130 interrupted (the batch keeps running on the server).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
import requests
from tqdm import tqdm

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_API = 1, 2, 3
_ENDED = ("completed", "failed", "expired", "cancelled")


class Api:
    def __init__(self, url: str, key: str | None, timeout: float = 60):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = timeout

    def call(self, method: str, path: str, **kwargs) -> requests.Response:
        try:
            resp = requests.request(method, f"{self.url}{path}", headers=self.headers,
                                    timeout=kwargs.pop("timeout", self.timeout), **kwargs)
        except requests.ConnectionError:
            fail(EXIT_API, f"cannot reach the llmq API at {self.url} (is it running? see --api-url)")
        except requests.Timeout:
            fail(EXIT_API, f"the llmq API at {self.url} did not answer in time")
        if resp.status_code >= 400:
            fail(EXIT_BAD_INPUT if resp.status_code in (400, 404, 409, 413, 422) else EXIT_API,
                 f"{method} {path}: HTTP {resp.status_code}: {_error_message(resp)}")
        return resp

    def json(self, method: str, path: str, **kwargs) -> dict:
        return self.call(method, path, **kwargs).json()


def _error_message(resp: requests.Response) -> str:
    try:
        return resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return resp.text[:300]


def fail(code: int, message: str):
    click.echo(f"llmq: {message}", err=True)
    sys.exit(code)


@click.group()
@click.option("--api-url", envvar="LLMQ_API_URL", default="http://127.0.0.1:8000", show_default=True,
              help="the llmq API (env LLMQ_API_URL)")
@click.option("--api-key", envvar="LLMQ_API_KEY", default=None, help="API key, if the server wants one (env LLMQ_API_KEY)")
@click.pass_context
def cli(ctx, api_url, api_key):
    """llmq: run batches of prompts and one-off prompts against an llmq server."""
    ctx.obj = Api(api_url, api_key)


@cli.group()
def batch():
    """OpenAI-style batches: a JSONL file of requests in, a JSONL file of results out."""


def check_input(path: Path) -> tuple[int, str]:
    """(requests, endpoint) of a batch input file, or exit 2 naming the first bad line."""
    urls, count = set(), 0
    with path.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                urls.add(line["url"])
                line["custom_id"], line["body"]
            except (ValueError, KeyError, TypeError):
                fail(EXIT_BAD_INPUT, f"{path}:{number}: not a batch request line (a JSON object with "
                                     "custom_id, method, url, body)")
            count += 1
    if not count:
        fail(EXIT_BAD_INPUT, f"{path}: no requests in the file")
    if len(urls) != 1:
        fail(EXIT_BAD_INPUT, f"{path}: all lines must use one url (found {sorted(urls)})")
    return count, urls.pop()


@batch.command("run")
@click.argument("input_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="where to write one result line per request, in input order")
@click.option("--poll", default=1.0, show_default=True, help="seconds between progress checks")
@click.pass_obj
def batch_run(api: Api, input_file: Path, output: Path, poll: float):
    """Upload INPUT_FILE, run it as a batch with a live progress bar, write the results."""
    try:
        total, endpoint = check_input(input_file)
    except UnicodeDecodeError:
        fail(EXIT_BAD_INPUT, f"{input_file}: not UTF-8 text")
    with input_file.open("rb") as handle:
        uploaded = api.json("POST", "/v1/files", data={"purpose": "batch"},
                            files={"file": (input_file.name, handle)}, timeout=600)
    created = api.json("POST", "/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": endpoint,
                                                    "completion_window": "24h"})
    batch_id = created["id"]
    click.echo(f"batch {batch_id}: {total} requests to {endpoint}", err=True)
    try:
        final = follow(api, batch_id, total, poll)
    except KeyboardInterrupt:
        fail(130, f"stopped watching; batch {batch_id} keeps running (llmq batch status|cancel {batch_id})")
    if final["status"] == "failed":
        for error in (final.get("errors") or {}).get("data", [])[:20]:
            click.echo(f"  line {error.get('line')}: {error.get('code')}: {error.get('message')}", err=True)
        fail(EXIT_BAD_INPUT, f"batch {batch_id} failed validation; nothing was run")
    written = write_results(api, final, output, order=custom_ids(input_file))
    counts = final["request_counts"]
    click.echo(f"batch {batch_id} {final['status']}: {counts['completed']} succeeded, {counts['failed']} failed; "
               f"{written} results in {output}", err=True)
    sys.exit(0 if final["status"] == "completed" and counts["failed"] == 0 else EXIT_FAILED)


def follow(api: Api, batch_id: str, total: int, poll: float) -> dict:
    """Poll the batch until it ends, with a progress bar of done/failed/total, rate and ETA."""
    with tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True) as bar:
        while True:
            state = api.json("GET", f"/v1/batches/{batch_id}")
            counts = state["request_counts"]
            done = counts["completed"] + counts["failed"]
            bar.total = counts["total"] or total
            bar.update(done - bar.n)
            bar.set_postfix_str(f"{state['status']}, {counts['failed']} failed")
            if state["status"] in _ENDED:
                return state
            time.sleep(poll)


def custom_ids(path: Path) -> list[str]:
    return [json.loads(text)["custom_id"] for text in path.open(encoding="utf-8") if text.strip()]


def write_results(api: Api, state: dict, output: Path, order: list[str] | None = None) -> int:
    """Output and error lines together, in the input's order when it is known."""
    lines = []
    for file_id in (state.get("output_file_id"), state.get("error_file_id")):
        if file_id:
            text = api.call("GET", f"/v1/files/{file_id}/content", timeout=600).text
            lines += [json.loads(line) for line in text.splitlines() if line.strip()]
    if order:
        rank = {custom_id: n for n, custom_id in enumerate(order)}
        lines.sort(key=lambda line: rank.get(line["custom_id"], len(rank)))
    output.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return len(lines)


@batch.command("status")
@click.argument("batch_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="if the batch has ended, also write its results here")
@click.pass_obj
def batch_status(api: Api, batch_id: str, output: Path | None):
    """Show a batch (as JSON); with -o, write the results of an ended batch."""
    state = api.json("GET", f"/v1/batches/{batch_id}")
    click.echo(json.dumps(state, indent=2))
    if output is not None and state["status"] in _ENDED:
        write_results(api, state, output)


@batch.command("cancel")
@click.argument("batch_id")
@click.pass_obj
def batch_cancel(api: Api, batch_id: str):
    """Cancel a batch: queued lines never run, running ones stop; finished results are kept."""
    state = api.json("POST", f"/v1/batches/{batch_id}/cancel")
    click.echo(f"batch {batch_id}: {state['status']}")


@batch.command("list")
@click.option("--limit", default=20, show_default=True)
@click.pass_obj
def batch_list(api: Api, limit: int):
    """Your batches, newest first."""
    for state in api.json("GET", "/v1/batches", params={"limit": limit})["data"]:
        counts = state["request_counts"]
        click.echo(f"{state['id']}  {state['status']:<11} {counts['completed']}/{counts['total']} done, "
                   f"{counts['failed']} failed  created {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(state['created_at']))}")


@cli.command()
@click.argument("prompt")
@click.option("--max-tokens", default=256, show_default=True)
@click.option("--temperature", default=0.7, show_default=True)
@click.option("--model", default=None, help="default: the model the server's workers serve")
@click.pass_obj
def submit(api: Api, prompt: str, max_tokens: int, temperature: float, model: str | None):
    """Send PROMPT as a chat message and stream the answer to stdout."""
    if model is None:
        served = api.json("GET", "/v1/models")["data"]
        if not served:
            fail(EXIT_API, "no worker is serving a model right now")
        model = served[0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": temperature, "stream": True}
    resp = api.call("POST", "/v1/chat/completions", json=body, stream=True, timeout=(10, 600))
    for raw in resp.iter_lines(decode_unicode=True):
        if not raw or not raw.startswith("data: "):
            continue
        data = raw[len("data: "):]
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            click.echo()
            fail(EXIT_API, chunk["error"]["message"])
        for choice in chunk.get("choices", []):
            click.echo(choice.get("delta", {}).get("content") or "", nl=False)
    click.echo()


@cli.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def tune(args):
    """Measure the engines and weights for a model on this host (a worker host: `python -m
    worker.tune`, whose options these are; --help lists them); workers with LLMQ_ENGINE /
    LLMQ_WEIGHTS `auto` serve with the winner."""
    import subprocess

    sys.exit(subprocess.call([sys.executable, "-m", "worker.tune", *args]))


if __name__ == "__main__":
    cli()
