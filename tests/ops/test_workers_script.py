"""`ops/workers.sh start` on a machine's GPUs: each GPU worker owns a group of GPUs (tensor x
pipeline parallel), named by `--gpu-groups` or cut from `--gpu G|all`; CPU workers see no GPU and
run the fastest CPU engine. No GPU here: `nvidia-smi` is a stand-in listing eight, and the worker a
stand-in that writes down the environment and arguments it was started with."""
import os
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin two workers")

FAKE_PYTHON = f"""#!/usr/bin/env bash
if [ "$2" = worker ]; then  # the worker: note how it was started, then wait to be stopped
  name=$(sed -E 's/.*--name [a-z]+-([a-z0-9]+)@.*/worker-\\1/' <<<"$*")
  {{ env | grep -E '^(CUDA_VISIBLE_DEVICES|LLMQ_ENGINE|LLMQ_VLLM_[A-Z_]+)='; echo "ARGS=$*"; }} \\
    > "$LLMQ_RUN_DIR/$name.started"
  exec sleep 60
fi
exec {sys.executable} "$@"
"""
FAKE_NVIDIA_SMI = "#!/usr/bin/env bash\nseq 0 7\n"  # --query-gpu=index: one GPU a line


@pytest.fixture
def workers(tmp_path):
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    for name, text in {"python": FAKE_PYTHON, "nvidia-smi": FAKE_NVIDIA_SMI}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMQ_", "CUDA_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHON=str(bin_dir / "python"), LLMQ_RUN_DIR=str(run_dir))

    def run(*args, **extra_env):
        return subprocess.run(["bash", "ops/workers.sh", *args], cwd=ROOT, env={**env, **extra_env},
                              capture_output=True, text=True, timeout=60)

    def started(count):
        """name -> {VAR: value} of the `count` workers started, once each has written it down (its
        ARGS line last)."""
        def written():
            files = sorted(run_dir.glob("*.started"))
            return len(files) >= count and all("ARGS=" in f.read_text() for f in files) and files
        files = wait_until(written, 20, interval=0.1, message=lambda: f"started: {list(run_dir.glob('*.started'))}")
        return {f.stem: dict(line.split("=", 1) for line in f.read_text().splitlines()) for f in files}

    yield run, started
    run("stop")


def test_gpu_all_is_cut_into_groups_of_tensor_parallel_size(workers):
    run, started = workers
    result = run("start", "--gpu", "all", LLMQ_VLLM_TENSOR_PARALLEL_SIZE="4")
    assert result.returncode == 0, result.stderr
    found = started(2)
    assert {name: env["CUDA_VISIBLE_DEVICES"] for name, env in found.items()} == \
        {"worker-gpu0": "0,1,2,3", "worker-gpu1": "4,5,6,7"}
    assert all(env["LLMQ_ENGINE"] == "vllm" and env["LLMQ_VLLM_TENSOR_PARALLEL_SIZE"] == "4"
               for env in found.values())
    cpus = [env["ARGS"].split("--cpus ")[1].split()[0] for env in found.values()]
    assert len(set(cpus)) == 2  # each worker its own CPU set


def test_named_groups_set_each_workers_tensor_parallel_size_and_cpu_workers_see_no_gpu(workers):
    run, started = workers
    result = run("start", "--cpu", "1", "--gpu-groups", "2,3")
    assert result.returncode == 0, result.stderr
    found = started(2)
    assert found["worker-gpu0"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert found["worker-gpu0"]["LLMQ_VLLM_TENSOR_PARALLEL_SIZE"] == "2"
    assert found["worker-cpu0"]["CUDA_VISIBLE_DEVICES"] == ""
    assert found["worker-cpu0"]["LLMQ_ENGINE"] == "auto"  # not the reference engine: the fastest


def test_pipeline_parallel_takes_its_share_of_a_group(workers):
    run, started = workers
    result = run("start", "--gpu-groups", "0,1,2,3", LLMQ_VLLM_PIPELINE_PARALLEL_SIZE="2")
    assert result.returncode == 0, result.stderr
    (env,) = started(1).values()
    assert env["LLMQ_VLLM_TENSOR_PARALLEL_SIZE"] == "2" and env["LLMQ_VLLM_PIPELINE_PARALLEL_SIZE"] == "2"


def test_gpus_that_do_not_fill_whole_groups_are_refused_before_anything_starts(workers, tmp_path):
    run, _ = workers
    result = run("start", "--gpu", "3", LLMQ_VLLM_TENSOR_PARALLEL_SIZE="2")
    assert result.returncode == 1
    assert "3 GPUs cannot be split into groups of 2" in result.stderr
    assert not list((tmp_path / "run").glob("worker-*.pid"))
