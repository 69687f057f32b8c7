"""llmq's HTTP API: a thin Flask app that validates, answers from the cache, and queues jobs.

It never loads a model or imports torch; workers do the generation.
"""
from __future__ import annotations

from flask import Flask

from api.errors import register_error_handlers
from api.services import Services
from common.settings import Settings, get_settings


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or get_settings()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False
    app.extensions["llmq"] = Services(settings)
    register_error_handlers(app)

    from api import health, jobs, openai_api

    app.register_blueprint(jobs.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(openai_api.bp)
    return app
