"""The Flask app of `bench/front_door.py --floor`: a streaming endpoint that does no work, so that what
a client waits for is Flask and gunicorn alone."""
from __future__ import annotations

import os

import gevent
from flask import Flask, Response, request

HOLD_S = float(os.environ.get("FLOOR_HOLD_S", "5"))
app = Flask(__name__)


@app.get("/ping")
def ping():
    return "ok"


@app.post("/v1/chat/completions")
def chat():
    request.get_json()

    def stream():
        yield ': queued {"queue_position": 1}\n\n'
        gevent.sleep(HOLD_S)
        yield "data: [DONE]\n\n"
    return Response(stream(), mimetype="text/event-stream")
