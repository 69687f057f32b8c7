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
    # '/v1/jobs/x/' is '/v1/jobs/x' and '//' is not merged: JSON answers, never 308 redirects
    app.url_map.strict_slashes = app.url_map.merge_slashes = False
    app.extensions["llmq"] = Services(settings)
    register_error_handlers(app)

    from api import auth, health, jobs, openai_api, openapi

    auth.init_app(app, settings)  # app-wide: every blueprint, present or future
    app.register_blueprint(jobs.bp)
    app.register_blueprint(health.bp)

    from api import metrics, web  # /metrics, access log, the chat page at /

    metrics.init_app(app, app.extensions["llmq"])
    app.register_blueprint(web.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(openai_api.bp)

    from api import batches_api, files_api, responses_api  # OpenAI's Files, Batch and Responses APIs

    app.register_blueprint(files_api.bp)
    app.register_blueprint(batches_api.bp)
    app.register_blueprint(responses_api.bp)
    return app
