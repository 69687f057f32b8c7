"""Helpers the tests share (plain code; the fixtures are in tests/conftest.py).

- settings.py: `make_settings` (a fresh key namespace on the test Redis), `fresh_namespace`,
  `settings_fixture` (a module's `settings`), `settings_env`, `cleanup_namespace`, the webhook
  signing secrets
- waiting.py: `wait_until` a condition holds, `wait_for_job` to end
- ports.py: `free_port`, `redis_port`
- parallel.py: which pytest-xdist process this is (its Redis db and port range follow)
- processes.py: a worker subprocess (`WorkerProcess`), a private redis-server (`PrivateRedis`),
  `kill_9_mid_job`
- servers.py: the API on a socket (`LiveServer`) and the `api` fixture's client (`ApiClient`)
- api_process.py: the API as a process of its own (`python -m api`, or gunicorn as deployed)
- jobs.py: a job through the jobs API over HTTP: `submit`, `read_stream`, `chunks_text`
- scripted_jobs.py: jobs queued straight into the store and run in-process by the worker's job
  runner on a scripted engine (no model)
- fakes.py: the scripted engine parts (`ScriptedRunner`, `CharTokenizer`), `run_to_end`
- engines.py: the engine contract's prompts, greedy `token_ids`
- logprobs.py: checks of an OpenAI answer's logprobs, shared by the engines' modules
- batches.py: batch input files and reading a batch's results over HTTP
- metrics.py: Prometheus text parsed into samples
- sse_subscriber.py: a thread subscribed to one job's SSE stream to its end
- webhook_receiver.py: a real HTTP webhook receiver on 127.0.0.1
- redis_group.py: a Redis Sentinel group of real processes (`RedisGroup`), and its failover
- random_models.py: random-weight models built here (a Qwen2.5-0.5B-size one, a tiny one, one that
  splits over two tensor-parallel ranks)
- held_jobs.py: a worker holding N jobs at once, and what that costs it (`hold`)

The benchmarks (bench/) use some of these too; nothing here imports bench/.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
