"""Structured logs: job ids reach every line logged while a job runs, in JSON and in text."""
import io
import json
import logging

import pytest

from common.logs import job_context, setup_logging
from tests.support.settings import make_settings


@pytest.fixture
def capture():
    root = logging.getLogger()
    saved = root.handlers[:], root.level

    def setup(json_logs: bool) -> io.StringIO:
        setup_logging(make_settings(log_json=json_logs), "worker")
        stream = io.StringIO()
        root.handlers[0].setStream(stream)
        return stream

    yield setup
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


def test_json_lines_carry_service_job_id_and_extras(capture):
    stream = capture(json_logs=True)
    log = logging.getLogger("some.library")
    with job_context("job-123"):
        log.info("step done", extra={"batch": 4})
    log.info("between jobs")
    log.info("explicit", extra={"job_id": "job-9"})
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "step done" and first["job_id"] == "job-123" and first["batch"] == 4
    assert first["service"] == "worker" and first["level"] == "INFO" and first["logger"] == "some.library"
    assert "job_id" not in second
    assert third["job_id"] == "job-9"


def test_text_lines_end_with_the_job(capture):
    stream = capture(json_logs=False)
    with job_context("abc"):
        logging.getLogger("x").warning("slow step")
    line = stream.getvalue().strip()
    assert " WARNING worker x: slow step [job abc]" in line
