"""Submit one prompt to llmq and stream the answer to the terminal.

    python ops/demo_client.py [--api URL] [--api-key KEY] [--wait-ready SECONDS] "prompt"

With API keys configured (LLMQ_API_KEYS / LLMQ_API_KEYS_FILE hold only their hashes), give it a
key: `--api-key`, or LLMQ_API_KEY as the `llmq` command takes it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import requests

sys.path.insert(0, __file__.rsplit("/ops/", 1)[0])
from common.sseclient import iter_sse  # noqa: E402


NEEDS_KEY = """The API answered 401: it wants an API key (LLMQ_API_KEYS or LLMQ_API_KEYS_FILE is set), and {problem}.
Give the demo one of your keys:  LLMQ_API_KEY=<key> bash ops/run.sh ["prompt"]
(or python ops/demo_client.py --api-key <key> "prompt"). The configured entries hold only the
keys' hashes; `python -m api.auth new demo` prints a new key and the entry to add for it.
ops/run.sh's services keep running; bash ops/stop.sh stops them."""


def wait_ready(api: str, timeout: float) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            health = requests.get(f"{api}/health", timeout=5).json()
            if health.get("workers"):
                print(f"\rready: model {health['model']['name']} ({health['model']['source']}), "
                      f"workers {health['workers']}", file=sys.stderr)
                return
            waiting = "a worker to load the model"
        except (requests.RequestException, ValueError):
            waiting = "the API to start"
        print(f"\rwaiting for {waiting} ... {time.monotonic() - start:.0f}s ", end="", file=sys.stderr,
              flush=True)
        time.sleep(1)
    sys.exit(f"llmq was not ready after {timeout:.0f}s; see .run/*.log")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("prompt")
    parser.add_argument("--api", default="http://127.0.0.1:8000")
    parser.add_argument("--wait-ready", type=float, default=0)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--api-key", default=os.environ.get("LLMQ_API_KEY") or None,
                        help="API key, if the server wants one (env LLMQ_API_KEY)")
    args = parser.parse_args()
    if args.wait_ready:
        wait_ready(args.api, args.wait_ready)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    job = requests.post(f"{args.api}/v1/jobs", headers=headers, json={
        "messages": [{"role": "user", "content": args.prompt}], "max_tokens": args.max_tokens,
        "temperature": 0.7, "top_p": 0.9}, timeout=30)
    if job.status_code == 401:
        sys.exit(NEEDS_KEY.format(problem="it refused the demo's key" if args.api_key else "the demo had none"))
    if job.status_code >= 400:
        sys.exit(f"error {job.status_code}: {job.text}")
    job = job.json()
    print(f"job {job['id']} {job['status']}\n\n> {args.prompt}\n", file=sys.stderr)
    with requests.get(f"{args.api}{job['links']['events']}", headers=headers, stream=True, timeout=300) as resp:
        for event in iter_sse(resp.iter_lines(chunk_size=None)):
            if event.event == "chunk":
                print(event.json()["text"], end="", flush=True)
            elif event.event == "done":
                done = event.json()
                print(f"\n\n[{done['status']}, finish_reason={done['finish_reason']}, "
                      f"usage={done['usage']}]", file=sys.stderr)
                break


if __name__ == "__main__":
    main()
