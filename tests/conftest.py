"""Every shared fixture (helpers are plain code in tests/support/).

A real Redis (own db, a fresh key namespace per module or test), the embedded model, and:
- `settings` -> `app` -> `api`: the API in-process, no worker. `settings` is the module's (a fresh
  namespace, cleaned up after the module); a module overrides it in one line,
  `settings = settings_fixture(max_queue=3)` (scope="function": a fresh namespace per test).
  `api` is a Flask test client of `app` with `.settings`, `.services` and `.serve()` (the same app
  on a socket, stopped after the test).
- `store`: the Redis job store of `settings`, for tests without an API; `receiver`: a webhook
  receiver on 127.0.0.1.
- the shared stack (`stack_settings`, `stack_app`, `worker`, `live_api`, `control_worker`): one
  real model worker and control worker for the session, the API on a socket in front of them.
- `hf_stack`: a worker on the reference engine (HF) and the API in front of it, for the session.
- `start_worker`, `start_control_worker`: more workers, for settings of a test's own (the model
  workers of a module stop after it).
"""
from __future__ import annotations

import itertools

import pytest
import redis

from api import create_app
from common.models import embedded_model
from common.settings import Settings
from common.stores import Stores
from tests.support.processes import WorkerProcess
from tests.support.servers import ApiClient, LiveServer, worker_beside_api
from tests.support.settings import REDIS_DB, REDIS_HOST, cleanup_namespace, make_settings, settings_fixture
from tests.support.webhook_receiver import Receiver


# The modules that take minutes (vLLM starts, worker kills, long generations), the slowest first.
# `bash ops/test.sh` runs modules on two pytest-xdist processes, each taking the next module when
# it is free (`--dist loadfile --no-loadscope-reorder`): the long ones go first, so that neither
# process is left running one of them alone at the end while the other has nothing to do.
SLOWEST_FIRST = [
    "tests/e2e/test_held_jobs.py",
    "tests/e2e/test_vllm_parallel.py",
    "tests/e2e/test_vllm_worker.py",
    "tests/engine/test_engine_contract.py",
    "tests/e2e/test_worker_crash.py",
    "tests/api/test_fuzz.py",
    "tests/engine/test_prompt_lookup.py",
    "tests/engine/test_openvino_engine.py",
    "tests/e2e/test_batch_yield.py",
    "tests/e2e/test_openai.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {module: i for i, module in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def _redis_up():
    try:
        redis.Redis.from_url(f"{REDIS_HOST}/{REDIS_DB}").ping()
    except redis.RedisError as exc:
        pytest.exit(f"Redis is not reachable at {REDIS_HOST} ({exc}); run `bash ops/test.sh`", 2)


@pytest.fixture(scope="session")
def model_ref():
    return embedded_model(make_settings(), prepare=True)


# --- the API in-process, no worker ------------------------------------------------------------
# The module's fresh namespace, cleaned up after its tests. A module that needs other settings, or
# a fresh namespace per test, says so in one line (tests.support.settings.settings_fixture):
#     settings = settings_fixture(max_queue=3)                     # or scope="function"
settings = settings_fixture()


@pytest.fixture(scope="module")
def _apps():
    return {}


@pytest.fixture
def app(settings, model_ref, _apps):
    """The Flask app of `settings`, built once per `settings` (once per module unless the module's
    `settings` is function-scoped)."""
    if settings.namespace not in _apps:
        _apps.clear()  # a function-scoped `settings`: the last test's app is done with
        _apps[settings.namespace] = create_app(settings)
    return _apps[settings.namespace]


@pytest.fixture
def api(app, settings):
    """A Flask test client of `app` (see `tests.support.servers.ApiClient`)."""
    client = ApiClient(app, settings)
    yield client
    client.stop_serving()


@pytest.fixture
def store(settings):
    """The job store on `settings`' namespace (common/jobs.py), for tests without an API."""
    return Stores(settings).jobs


@pytest.fixture
def receiver():
    """A webhook receiver on 127.0.0.1 (tests.support.webhook_receiver.Receiver), stopped after the test."""
    receiver = Receiver()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def prompts(model_ref):
    """The engine contract's prompts (tests.support.engines.PROMPTS) as the embedded model's
    chat-templated token ids."""
    from common.prompting import PromptBuilder
    from tests.support.engines import PROMPTS

    builder = PromptBuilder(model_ref.path, 1024)
    return [builder.build([{"role": "user", "content": p}], None)[1] for p in PROMPTS]


# --- real workers ----------------------------------------------------------------------------
_worker_numbers = itertools.count()  # Celery node names unique across every factory of the session


def _workers(tmp_path_factory):
    """A factory that starts workers for some settings; generator: stops them all when closed."""
    started: list[WorkerProcess] = []

    def start(settings: Settings, concurrency: int | None = None, wait: bool = True,
              args: tuple[str, ...] = ()) -> WorkerProcess:
        name = f"w{next(_worker_numbers)}-{settings.namespace}"
        worker = WorkerProcess(settings, name, tmp_path_factory.mktemp("logs") / f"{name}.log", concurrency,
                               args=args)
        started.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="module")
def start_worker(model_ref, tmp_path_factory):
    """Factory: start a worker for some settings; the module's workers stop after its last test, so
    none idles on through the session beside the modules that follow (a vLLM worker holds GiBs)."""
    yield from _workers(tmp_path_factory)


@pytest.fixture(scope="session")
def start_session_worker(model_ref, tmp_path_factory):
    """Factory: the same, for the session's shared workers (stopped at the end of the session)."""
    yield from _workers(tmp_path_factory)


@pytest.fixture(scope="session")
def start_control_worker(tmp_path_factory):
    """Factory: start a `python -m worker.control` (webhook deliveries) for some settings; all are
    stopped at the end of the session. No model: it starts in a few seconds."""
    started: list[WorkerProcess] = []

    def start(settings: Settings) -> WorkerProcess:
        name = f"control{len(started)}-{settings.namespace}"
        worker = WorkerProcess(settings, name, tmp_path_factory.mktemp("logs") / f"{name}.log",
                               module="worker.control")
        started.append(worker)
        worker.wait_ready(timeout=60)
        return worker

    yield start
    for worker in started:
        worker.stop()


# --- the shared stack: one model worker for the session, the API on a socket --------------------
@pytest.fixture(scope="session")
def stack_settings():
    settings = make_settings()
    yield settings
    cleanup_namespace(settings)


@pytest.fixture(scope="session")
def worker(stack_settings, start_session_worker):
    """The session's shared worker."""
    return start_session_worker(stack_settings)


@pytest.fixture(scope="session")
def control_worker(stack_settings, start_control_worker):
    """The session's control worker, next to the shared model worker."""
    return start_control_worker(stack_settings)


@pytest.fixture(scope="session")
def stack_app(stack_settings, model_ref):
    return create_app(stack_settings)


@pytest.fixture(scope="session")
def live_api(stack_app, worker):
    """The API on a real socket, backed by the shared worker: its URL."""
    server = LiveServer(stack_app)
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def hf_stack(start_session_worker):
    """A worker on the reference engine (HF) for the session, the API on a socket in front of it:
    (settings, URL), for the modules that check that engine by name; started by the first."""
    settings = make_settings(engine="hf", max_batch_size=8)
    with worker_beside_api(start_session_worker, settings) as (_, url):
        yield settings, url
