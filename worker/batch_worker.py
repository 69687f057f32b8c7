"""Start a batch worker: `python -m worker.batch_worker [--concurrency N] [--name NAME]`.

A light Celery worker with no model: it consumes the batch queue (validation of input files,
progress, output files; see worker/batch_tasks.py) and runs the batches' watchdog. Run one or more
next to the API; without one, batches stay `validating`.
"""
from __future__ import annotations

import argparse
import os

from common.keys import Keys
from common.logs import setup_logging
from common.settings import get_settings


def main(argv: list[str] | None = None) -> None:
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m worker.batch_worker", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=4, help="batch steps run at once")
    parser.add_argument("--name", default=None, help="Celery node name")
    parser.add_argument("--loglevel", default=settings.log_level)
    args = parser.parse_args(argv)
    setup_logging(settings, "batch-worker")
    from worker.batch_tasks import app, start_watchdog

    start_watchdog()
    name = args.name or f"llmq-batches-{os.getpid()}@%h"
    app.worker_main(["worker", "--pool", "threads", "--concurrency", str(args.concurrency),
                     "--queues", Keys(settings.namespace).batch_queue, "--hostname", name,
                     "--loglevel", args.loglevel, "--without-gossip", "--without-mingle"])


if __name__ == "__main__":
    main()
