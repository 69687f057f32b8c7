"""The API on a real socket, and the client the `api` fixture hands a test."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from flask import Flask
from flask.testing import FlaskClient
from werkzeug.serving import make_server

from api.services import Services
from common.settings import Settings


class LiveServer:
    """A Flask app served by a threaded werkzeug server on 127.0.0.1, on a free port."""

    def __init__(self, app: Flask):
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()


@contextmanager
def worker_beside_api(start_worker, settings: Settings, ready_timeout: float = 120) -> Iterator[tuple]:
    """A model worker of `settings` (started by the `start_worker` fixture, ready) and the API on
    a socket beside it: yields (worker, URL); the server is stopped and the namespace cleaned up
    after. What an engine's end-to-end module builds once."""
    from api import create_app
    from tests.support.settings import cleanup_namespace

    worker = start_worker(settings, wait=False)
    worker.wait_ready(timeout=ready_timeout)
    server = LiveServer(create_app(settings))
    try:
        yield worker, server.url
    finally:
        server.stop()
        cleanup_namespace(settings)


class ApiClient(FlaskClient):
    """The `api` fixture: a Flask test client of the app built from `settings`, carrying that
    `settings`, the app's `services` (`app.extensions['llmq']`: store, registry, celery...) and
    `serve()`, which puts the same app on a real socket for a test that needs one (SSE read by
    `requests`, a client library) and returns its URL; the fixture stops it after the test."""

    def __init__(self, app: Flask, settings: Settings):
        super().__init__(app, app.response_class, use_cookies=True)
        self.settings = settings
        self._server: LiveServer | None = None

    @property
    def services(self) -> Services:
        return self.application.extensions["llmq"]

    def serve(self) -> str:
        if self._server is None:
            self._server = LiveServer(self.application)
        return self._server.url

    def stop_serving(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
