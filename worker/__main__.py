"""Start a worker: `python -m worker [--cpus 0-1] [--concurrency N] [--name NAME] [--models A,B]`.

Pins the process to its CPU set, loads its model(s) once, then runs a Celery consumer with the
threads pool: each thread carries one job, and the jobs of one model share its engine's batch.
With a catalog of several models it also loads the ones nobody holds when jobs wait for them
(worker/held_models.py).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from celery.utils.nodenames import host_format

from common.catalog import Catalog, CatalogError, CatalogModel
from common.logs import setup_logging
from common.settings import get_settings
from worker.pinning import keep_off_the_compute_cores, parse_cpus, yield_to_the_engine_core

log = logging.getLogger("worker")


def main(argv: list[str] | None = None) -> None:
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    parser.add_argument("--cpus", default=settings.cpus, help="CPU set, e.g. 0-1 (default: all)")
    parser.add_argument("--threads", type=int, default=settings.torch_threads,
                        help="threads of an engine on torch (default: one per core of --cpus)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="jobs held at once (default: the engines' max batch sizes)")
    parser.add_argument("--name", default=None, help="Celery node name")
    parser.add_argument("--loglevel", default=settings.log_level)
    parser.add_argument("--models", default=None,
                        help="catalog models to load at start, comma-separated, or 'none' "
                             "(default: the catalog's default model)")
    parser.add_argument("--metrics-port", type=int, default=settings.metrics_port,
                        help="serve Prometheus metrics on this port (0: off)")
    args = parser.parse_args(argv)
    # torch's threads are set by the engines that compute with it (`pinning.set_torch_threads`)
    settings = settings.model_copy(update={"metrics_port": args.metrics_port, "torch_threads": args.threads})

    setup_logging(settings, "worker")
    try:
        catalog = Catalog.from_settings(settings)
        preload = _preload(catalog, args.models)
    except CatalogError as exc:
        sys.exit(f"llmq worker: {exc}")
    if args.cpus:
        os.sched_setaffinity(0, parse_cpus(args.cpus))
    from worker.held_models import HeldModels
    from worker.metrics import serve_held_metrics
    from worker.runtime import worker_stores

    held = HeldModels(settings, worker_stores(settings), catalog)
    runtimes = [held.load(entry) for entry in preload]
    if len(runtimes) == 1 and args.concurrency is not None and runtimes[0].free_slots is not None:
        runtimes[0].free_slots.slots = args.concurrency  # the threads that take tickets
    if any(rt.engine_kind == "vllm" for rt in runtimes):  # service threads off the compute cores, below vLLM's
        keep_off_the_compute_cores(settings.vllm_cpu_reserved_cores)
        yield_to_the_engine_core(settings.vllm_relay_nice)
    if settings.metrics_port:
        serve_held_metrics(held, settings.metrics_port, settings.metrics_host)
    from worker import tasks

    tasks.serve(held)
    first = runtimes[0].model.name if len(runtimes) == 1 else None
    name = args.name or (f"llmq-{first}-{os.getpid()}@%h" if first else f"llmq-{os.getpid()}@%h")
    queues = [q for rt in runtimes for q in (rt.queue, rt.own_queue)] or [f"{settings.namespace}.idle"]
    _follow_placement(held, tasks.app, host_format(name))
    try:
        tasks.app.worker_main(["worker", "--pool", "threads", "--concurrency", str(_threads(args, settings, catalog)),
                               "--queues", ",".join(queues), "--hostname", name, "--loglevel", args.loglevel,
                               "--task-events", "--without-gossip", "--without-mingle"])
    finally:  # a clean shutdown (its jobs done or handed back): gone from /health at once
        held.close()
    # Nothing is left to run once the engine is closed. Skip the interpreter's teardown: with the
    # engine's native libraries and their threads still loaded it can crash (a SIGSEGV was seen
    # once as a worker stopped on SIGTERM), and a supervisor would read a clean stop as a crash.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _preload(catalog: Catalog, models: str | None) -> list[CatalogModel]:
    """The catalog models `--models` names (default: the catalog's default)."""
    if models is None:
        return [catalog.default]
    if models.strip().lower() == "none":
        return []
    if not catalog.named:  # one model, whatever it is called
        return [catalog.default]
    names = [m.strip() for m in models.split(",") if m.strip()]
    if any(m not in catalog.models for m in names):
        raise CatalogError(f"--models {models!r}: the catalog serves {sorted(catalog.models)}")
    return [catalog.models[m] for m in names]


def _threads(args, settings, catalog: Catalog) -> int:
    """Celery threads: one per batch slot of every model the worker may hold at once."""
    if args.concurrency is not None:
        return args.concurrency
    slots = sorted((m.settings(settings).max_batch_size for m in catalog.models.values()), reverse=True)
    return sum(slots[:settings.worker_max_models])


def _follow_placement(held, app, node: str) -> None:
    """Once the consumer runs, models loaded later are consumed through Celery's control commands
    (which Flower also shows), and placement starts."""
    from celery.signals import worker_ready

    def tell(command: str):
        def send(queue: str) -> None:
            replies = app.control.broadcast(command, arguments={"queue": queue}, destination=[node],
                                            reply=True, timeout=10)
            if not replies:
                log.warning("%s %s: no reply from this worker's consumer", command, queue)
        return send

    @worker_ready.connect(weak=False)
    def _ready(**_) -> None:
        held.consume, held.stop_consuming = tell("add_consumer"), tell("cancel_consumer")
        held.start_placing()


if __name__ == "__main__":
    main()
