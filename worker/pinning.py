"""Where llmq's work runs on the CPUs: a CPU set per worker, and beside vLLM on a CPU, which cores
and which priority its compute, its engine core and the worker's own threads get.

Every placement decision lives here, so an engine adapter only applies what this module says.

`python -m worker.pinning K` prints K CPU specs, one a line (used by `ops/workers.sh`): each worker
gets its own contiguous share of the CPUs this process may use, so two workers never compete for a
core and each sizes its torch thread pool to its share. `python -m worker.pinning --service`
prints the service cores of this process's CPUs, and `--relay-nice` the niceness for what runs
there beside vLLM's engine core (both used by `ops/run.sh` to start the API beside a vLLM worker).
`--gpu-groups SIZE GPU...` prints the GPUs in groups of SIZE, one worker's a line (`ops/workers.sh`).
"""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)


def parse_cpus(spec: str) -> set[int]:
    """'0-1,4' -> {0, 1, 4}"""
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpus(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'"""
    parts, ordered = [], sorted(cpus)
    start = prev = ordered[0]
    for cpu in ordered[1:] + [None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts)


def split_cpus(available: set[int] | list[int], workers: int) -> list[str]:
    """`workers` disjoint CPU specs covering `available`, as even as possible."""
    cpus = sorted(available)
    if not 1 <= workers <= len(cpus):
        raise ValueError(f"cannot give {workers} workers a core each out of {len(cpus)} CPUs")
    base, extra = divmod(len(cpus), workers)
    specs, start = [], 0
    for i in range(workers):
        size = base + (i < extra)
        specs.append(format_cpus(cpus[start:start + size]))
        start += size
    return specs


def service_and_compute(cpus: set[int] | list[int], reserved: int) -> tuple[list[int], list[int]]:
    """A vLLM worker's CPU set as (service, compute) cores: the first `reserved` cores serve
    everything but the model's matrix work (vLLM's scheduler process, the job threads, the API,
    Redis), the others compute. At least one core always computes; with a single core both are it."""
    ordered = sorted(cpus)
    keep = min(reserved, len(ordered) - 1)
    return (ordered[:keep] or ordered), ordered[keep:]


def service_cores() -> list[int]:
    """The service cores of this process's CPUs, per `vllm_cpu_reserved_cores`: where the API
    goes beside a vLLM worker on the same machine."""
    from common.settings import get_settings

    return service_and_compute(os.sched_getaffinity(0), get_settings().vllm_cpu_reserved_cores)[0]


def confine_to(service: list[int], compute: list[int], pids: list[int]) -> int:
    """Move every thread of `pids` that is not bound inside the compute cores onto the service
    cores: the compute cores are then left to the threads vLLM bound there. Returns the number
    of threads moved; threads that end meanwhile are skipped."""
    moved, computing = 0, set(compute)
    for pid in pids:
        for tid in _threads(pid):
            try:
                if not os.sched_getaffinity(tid) <= computing:
                    os.sched_setaffinity(tid, service)
                    moved += 1
            except (ProcessLookupError, FileNotFoundError):
                pass
    return moved


def lower_priority(pid: int, nice: int) -> int:
    """Raise every thread of `pid` to niceness `nice` (threads already nicer are left as they are);
    threads it starts later inherit it from their creator. Linux keeps a niceness per thread, so
    all of them are set, not just the main one. Returns the number of threads changed."""
    changed = 0
    for tid in _threads(pid):
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except (ProcessLookupError, FileNotFoundError):
            pass
    return changed


def rank_cpus(cpus: set[int], reserved: int, ranks: int = 1) -> list[str]:
    """The compute cores of a vLLM worker on CPU, split into one disjoint set per rank of its
    tensor x pipeline parallel layout (each rank runs its share of every step on its own cores)."""
    _, compute = service_and_compute(cpus, reserved)
    if ranks > len(compute):
        raise ValueError(f"{ranks} parallel ranks need a compute core each; this worker has "
                         f"{len(compute)} ({format_cpus(compute)}): give it more CPUs or fewer ranks")
    return split_cpus(compute, ranks)


def cpu_binding_env(cpus: set[int], reserved: int, ranks: int = 1) -> dict[str, str]:
    """vLLM's CPU thread binding, taken from the worker's CPU set rather than the whole machine:
    compute threads on the compute cores (one set per rank, '|' between them, as vLLM reads it),
    `reserved` service cores left to vLLM's scheduler process, the job threads and, on a small
    machine, the API and Redis. Reserving a core spares the lock-step matrix work from preemption
    but takes a whole core from it, which costs more on small workers; so by default nothing is
    reserved (docs/vllm-on-cpu.md)."""
    _, compute = service_and_compute(cpus, reserved)
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(rank_cpus(cpus, reserved, ranks)),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": str(len(cpus) - len(compute))}


def gpu_groups(gpus: list[str], size: int) -> list[str]:
    """GPU ids split into consecutive groups of `size`, one worker each ('0,1,2,3' for a worker
    of tensor parallel 4): a worker owns its group through CUDA_VISIBLE_DEVICES."""
    if size < 1 or not gpus or len(gpus) % size:
        raise ValueError(f"{len(gpus)} GPUs cannot be split into groups of {size}")
    return [",".join(gpus[i:i + size]) for i in range(0, len(gpus), size)]


def parallel_layout(settings, on_gpu: bool, cpus: set[int] | None = None) -> dict:
    """What the heartbeat, /health and the logs say of a vLLM worker's parallel layout: its
    tensor and pipeline sizes and, per rank, the GPU or the CPU cores it computes on."""
    tensor, pipeline = settings.vllm_tensor_parallel_size, settings.vllm_pipeline_parallel_size
    if on_gpu:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ranks = [f"cuda:{gpu}" for gpu in visible.split(",") if gpu] or \
            [f"cuda:{i}" for i in range(tensor * pipeline)]
    else:
        cpus = cpus if cpus is not None else os.sched_getaffinity(0)
        ranks = [f"cpus {spec}" for spec in rank_cpus(cpus, settings.vllm_cpu_reserved_cores, tensor * pipeline)]
    return {"tensor_parallel": tensor, "pipeline_parallel": pipeline, "ranks": ranks[:tensor * pipeline]}


def set_torch_threads(settings) -> int:
    """Torch's threads: `torch_threads`, or one per core of this process's CPU set; returns how
    many. Called by the engines that compute with torch as they are built (their heartbeat info
    names the count), so that a worker of another engine (the OpenVINO default) never loads
    torch: seconds of its start and a few hundred MiB."""
    import torch

    torch.set_num_threads(settings.torch_threads or len(os.sched_getaffinity(0)))
    return torch.get_num_threads()


def keep_off_the_compute_cores(reserved: int) -> None:
    """Once vLLM runs on CPU with cores reserved: every thread of this process (job threads,
    Celery's, the engine loop) moves to the service cores, so none lands on a compute core and
    makes the model's step wait for it. vLLM's own processes stay where vLLM put them, as under
    vLLM's own server: its engine core must stay free to run on any core, since it schedules the
    next step exactly while the relay keeps the service core busy. With nothing reserved there is
    nowhere else to go, and nothing moves.

    It changes the whole process's placement, so the worker's entry point calls it, not the
    engine (which tests also build inside the test process)."""
    import torch

    if torch.cuda.is_available():
        return
    service, compute = service_and_compute(os.sched_getaffinity(0), reserved)
    if service == compute:
        return
    moved = confine_to(service, compute, [os.getpid()])
    log.info("vLLM computes on cores %s; %d worker threads moved to service cores %s", compute, moved, service)


def yield_to_the_engine_core(nice: int) -> None:
    """Once vLLM runs on CPU: this process's own threads (the relay of tokens to Redis, Celery's,
    the engine loop's) take niceness `nice`; vLLM's children, started before, keep theirs.

    The relay wakes exactly when vLLM's engine core schedules the next step, and the relay can
    lose a few milliseconds unnoticed while the step cannot. But with vLLM computing on every
    core (the default) a nicer relay waits for the compute threads instead and each job ends
    later, so the default is 0 (docs/vllm-on-cpu.md)."""
    import torch

    if torch.cuda.is_available() or nice <= 0:
        return
    changed = lower_priority(os.getpid(), nice)
    log.info("worker threads at niceness %d (%d changed), below vLLM's engine core", nice, changed)


def relay_delay_s(settings) -> float:
    """How long each vLLM step's tokens wait in the worker before they are relayed (CPU only).

    Between steps vLLM's engine core spins on `sched_yield`, which hands its core to any runnable
    thread: the relay the tokens wake would run first and delay the next step by its own time.
    Holding the tokens a moment lets the engine core schedule first, and the relay then overlaps
    the next step's compute. Once vLLM's children ran without a wrapper frame the delay no longer
    paid, so it is off by default and kept as a knob for other hosts (docs/vllm-on-cpu.md)."""
    import torch

    if settings is None or torch.cuda.is_available():
        return 0.0
    return settings.vllm_relay_delay_ms / 1000


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _main(argv: list[str]) -> None:
    if argv[:1] == ["--service"]:
        print(format_cpus(service_cores()))
    elif argv[:1] == ["--gpu-groups"]:  # --gpu-groups SIZE GPU... : one group a line
        print("\n".join(gpu_groups(argv[2:], int(argv[1]))))
    elif argv[:1] == ["--relay-nice"]:
        from common.settings import get_settings

        print(get_settings().vllm_relay_nice)
    else:
        print("\n".join(split_cpus(os.sched_getaffinity(0), int(argv[0]))))


if __name__ == "__main__":
    try:
        _main(sys.argv[1:])
    except ValueError as exc:  # a layout that cannot be: say so, for the script that asked
        sys.exit(f"worker.pinning: {exc}")
