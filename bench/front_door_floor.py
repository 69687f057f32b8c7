"""The floor of the front door on this machine: how soon one API process can answer N streaming
clients that connect at once when answering costs nothing but Flask and gunicorn themselves.

    .venv/bin/python bench/front_door_floor.py --levels 100,1000,5000

The server is gunicorn with llmq's own settings (ops/gunicorn.conf.py: one gevent worker) over a
Flask app that does no work: it reads the JSON body, sends the stream's headers and a `: queued`
comment, holds the stream `--hold-s` seconds and ends it (bench/front_door_floor_app.py). No
Redis, no tokenizer, no job. The clients are bench/front_door.py's (aiohttp, a connection each, on
the same cores), with the same body. What this measures for N clients is the least any Flask API
on this host can do, so the real API's time to headers (bench/front_door.py) reads against it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.front_door import Client, chat_body, client_session, percentile, raise_open_files, stream_chat  # noqa: E402
from bench.stack import ROOT, free_port, wait_http_ok  # noqa: E402


async def level(url: str, count: int, hold_s: float) -> dict:
    clients = [Client(i) for i in range(count)]
    deadline = asyncio.get_running_loop().time() + hold_s + 30
    async with client_session() as session:
        await asyncio.gather(*(stream_chat(session, url, chat_body("floor", f"hello {c.index}", 8), c, deadline)
                               for c in clients))
    headers = [c.headers_s for c in clients if c.status == 200]
    return {"clients": count, "answered": len(headers), "errors": sum(c.error is not None for c in clients),
            **{f"headers_p{q}": round(percentile(headers, q) or 0, 3) for q in (50, 95, 99)},
            "headers_max": round(max(headers, default=0), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1000, 5000])
    parser.add_argument("--hold-s", type=float, default=5.0)
    args = parser.parse_args()
    raise_open_files(max(args.levels))
    port = free_port()
    env = {**os.environ, "FLOOR_HOLD_S": str(args.hold_s)}
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "ops/gunicorn.conf.py", "-b",
                               f"127.0.0.1:{port}", "bench.front_door_floor_app:app"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/ping", 60, "the floor app")
        requests.post(f"{url}/v1/chat/completions", json=chat_body("floor", "warm", 8), timeout=30)
        for count in args.levels:
            print(json.dumps(asyncio.run(level(url, count, args.hold_s))), flush=True)
            time.sleep(2)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
