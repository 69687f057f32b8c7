"""CPU sets for pinned workers: each worker its own cores, all cores used, none shared; a vLLM
worker's set split into service and compute cores, everything unbound kept off the compute ones,
and the worker's own threads below the priority of vLLM's engine core."""
import os
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.waiting import wait_until
from tests.support.settings import make_settings
from worker.pinning import (confine_to, cpu_binding_env, format_cpus, gpu_groups, lower_priority,
                            parallel_layout, parse_cpus, rank_cpus, service_and_compute, split_cpus)


@pytest.mark.parametrize("cpus, workers", [(range(8), 3), (range(2), 2), ([0, 2, 4, 5, 6], 2), (range(16), 16)])
def test_split_gives_disjoint_sets_covering_every_cpu(cpus, workers):
    specs = split_cpus(set(cpus), workers)
    sets = [parse_cpus(spec) for spec in specs]
    assert len(sets) == workers and all(sets)
    assert set().union(*sets) == set(cpus)
    assert sum(map(len, sets)) == len(set(cpus))  # disjoint
    assert max(map(len, sets)) - min(map(len, sets)) <= 1  # even


def test_format_and_parse_round_trip():
    assert format_cpus([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert parse_cpus("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}


def test_more_workers_than_cpus_is_refused():
    with pytest.raises(ValueError, match="cannot give 3 workers"):
        split_cpus({0, 1}, 3)


def test_cli_prints_one_set_per_worker_from_this_process_affinity():
    out = subprocess.run([sys.executable, "-m", "worker.pinning", "1"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == [format_cpus(sorted(os.sched_getaffinity(0)))]


def test_service_cores_come_first_and_one_core_always_computes():
    assert service_and_compute({0, 1, 2, 3}, reserved=1) == ([0], [1, 2, 3])
    assert service_and_compute({4, 5}, reserved=3) == ([4], [5])
    assert service_and_compute({2, 3}, reserved=0) == ([2, 3], [2, 3])  # nothing reserved: all compute
    assert service_and_compute({7}, reserved=1) == ([7], [7])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_confine_moves_unbound_threads_to_the_service_cores_and_leaves_bound_ones():
    service, compute = service_and_compute(os.sched_getaffinity(0), reserved=1)
    code = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    floating = subprocess.Popen([sys.executable, "-c", code])
    bound = subprocess.Popen(["taskset", "-c", str(compute[0]), sys.executable, "-c", code])
    try:
        wait_until(lambda: len(os.listdir(f"/proc/{floating.pid}/task")) >= 2, 10)  # its second thread
        assert confine_to(service, compute, [floating.pid, bound.pid]) >= 2
        for tid in os.listdir(f"/proc/{floating.pid}/task"):
            assert os.sched_getaffinity(int(tid)) == set(service)
        for tid in os.listdir(f"/proc/{bound.pid}/task"):
            assert os.sched_getaffinity(int(tid)) == {compute[0]}
    finally:
        floating.kill()
        bound.kill()


def pinning_cli(flag: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-m", "worker.pinning", flag], cwd=ROOT, capture_output=True,
                          text=True, check=True, env={**os.environ, **env}).stdout.strip()


def test_cli_prints_the_service_cores():
    out = pinning_cli("--service", LLMQ_VLLM_CPU_RESERVED_CORES="1")
    assert parse_cpus(out) == set(service_and_compute(os.sched_getaffinity(0), 1)[0])


_TWO_THREADS = """
import os, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print('ready', flush=True)
sys.stdin.readline()
later = []
thread = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0)))
thread.start(); thread.join()
print(later[0], flush=True)
"""


def test_lower_priority_reaches_every_thread_and_the_threads_started_after():
    proc = subprocess.Popen([sys.executable, "-c", _TWO_THREADS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        assert len(tids) == 2
        assert lower_priority(proc.pid, 7) == 2
        assert [os.getpriority(os.PRIO_PROCESS, tid) for tid in tids] == [7, 7]
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "7"  # inherited from the thread that started it
    finally:
        proc.kill()
        proc.wait()


def test_lower_priority_never_raises_a_threads_priority():
    proc = subprocess.Popen(["nice", "-n", "15", "sleep", "60"])
    try:
        wait_until(lambda: os.getpriority(os.PRIO_PROCESS, proc.pid) == 15, 10)  # `nice` has exec'd `sleep`
        assert lower_priority(proc.pid, 5) == 0
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 15
    finally:
        proc.kill()
        proc.wait()


def test_cli_prints_the_relay_niceness():
    assert pinning_cli("--relay-nice", LLMQ_VLLM_RELAY_NICE="12") == "12"


def test_a_parallel_vllm_worker_binds_each_rank_to_its_own_compute_cores():
    env = cpu_binding_env({0, 1, 2, 3, 4}, reserved=1, ranks=2)
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "1-2|3-4", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    assert cpu_binding_env({0, 1}, reserved=0) == {"VLLM_CPU_OMP_THREADS_BIND": "0-1",
                                                   "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    with pytest.raises(ValueError, match="4 parallel ranks need a compute core each; this worker has 2"):
        rank_cpus({0, 1}, reserved=0, ranks=4)


def test_gpus_are_grouped_per_worker_and_ragged_groups_refused():
    assert gpu_groups([str(i) for i in range(8)], 4) == ["0,1,2,3", "4,5,6,7"]
    assert gpu_groups(["0", "1"], 1) == ["0", "1"]
    with pytest.raises(ValueError, match="3 GPUs cannot be split into groups of 2"):
        gpu_groups(["0", "1", "2"], 2)


def test_the_parallel_layout_names_each_ranks_gpu_or_cores(monkeypatch):
    settings = make_settings(vllm_tensor_parallel_size=2, vllm_pipeline_parallel_size=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert parallel_layout(settings, on_gpu=True) == {
        "tensor_parallel": 2, "pipeline_parallel": 2, "ranks": ["cuda:4", "cuda:5", "cuda:6", "cuda:7"]}
    on_cpu = parallel_layout(settings, on_gpu=False, cpus={0, 1, 2, 3, 4, 5, 6, 7})
    assert on_cpu["ranks"] == ["cpus 0-1", "cpus 2-3", "cpus 4-5", "cpus 6-7"]
