"""The web chat page at `/`: one static HTML file and one script, no build step.

The page talks to the public API only (`POST /v1/jobs`, the job's SSE stream, `GET /v1/jobs/<id>`);
`/ui/config` tells it the served model and its context length.
"""
from __future__ import annotations

from pathlib import Path

from flask import Blueprint, jsonify, send_from_directory

from api.services import services

STATIC = Path(__file__).parent / "static"
bp = Blueprint("web", __name__, static_folder=str(STATIC), static_url_path="/ui/static")


@bp.get("/")
def chat_page():
    return send_from_directory(STATIC, "chat.html", max_age=0)


@bp.get("/ui/config")
def ui_config():
    svc = services()
    model, builder = svc.admission.model()
    return jsonify({"model": model.name, "context_length": builder.context_length,
                    "max_tokens_cap": svc.settings.max_tokens_cap,
                    "default_max_tokens": svc.settings.default_max_tokens,
                    "models": svc.admission.served_models()})
