"""Start a worker: `python -m worker [--cpus 0-1] [--concurrency N] [--name NAME]`.

Pins the process to its CPU set, loads the model once, then runs a Celery consumer with the threads
pool: each thread carries one job, and all of them share the engine's batch.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from common.logs import setup_logging
from common.settings import get_settings
from worker.pinning import keep_off_the_compute_cores, parse_cpus, yield_to_the_engine_core


def pin(cpus: str | None, torch_threads: int | None) -> None:
    import torch

    if cpus:
        os.sched_setaffinity(0, parse_cpus(cpus))
    torch.set_num_threads(torch_threads or len(os.sched_getaffinity(0)))


def main(argv: list[str] | None = None) -> None:
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    parser.add_argument("--cpus", default=settings.cpus, help="CPU set, e.g. 0-1 (default: all)")
    parser.add_argument("--threads", type=int, default=settings.torch_threads, help="torch threads")
    parser.add_argument("--concurrency", type=int, default=settings.max_batch_size,
                        help="jobs held at once (default: the engine's max batch size)")
    parser.add_argument("--name", default=None, help="Celery node name")
    parser.add_argument("--loglevel", default=settings.log_level)
    parser.add_argument("--metrics-port", type=int, default=settings.metrics_port,
                        help="serve Prometheus metrics on this port (0: off)")
    args = parser.parse_args(argv)
    settings = settings.model_copy(update={"metrics_port": args.metrics_port})

    setup_logging(settings, "worker")
    pin(args.cpus, args.threads)
    from worker.runtime import WorkerRuntime, set_runtime

    runtime = WorkerRuntime.build(settings)
    runtime.free_slots.slots = args.concurrency  # the threads that take tickets
    if runtime.engine_kind == "vllm":  # service threads off the compute cores, and below vLLM's
        keep_off_the_compute_cores(settings.vllm_cpu_reserved_cores)
        yield_to_the_engine_core(settings.vllm_relay_nice)
    set_runtime(runtime)
    if settings.metrics_port:
        runtime.metrics.serve(settings.metrics_port, settings.metrics_host)
    runtime.start_heartbeat()
    runtime.heartbeat()
    from worker.tasks import app

    name = args.name or f"llmq-{runtime.model.name}-{os.getpid()}@%h"
    try:
        app.worker_main(["worker", "--pool", "threads", "--concurrency", str(args.concurrency),
                         "--queues", f"{runtime.queue},{runtime.own_queue}", "--hostname", name,
                         "--loglevel", args.loglevel,
                         "--task-events", "--without-gossip", "--without-mingle"])
    finally:  # a clean shutdown (its jobs done or handed back): gone from /health at once
        runtime.sign_off()
        runtime.close()
    # Nothing is left to run once the engine is closed. Skip the interpreter's teardown: with the
    # engine's native libraries and their threads still loaded it can crash (a SIGSEGV was seen
    # once as a worker stopped on SIGTERM), and a supervisor would read a clean stop as a crash.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
