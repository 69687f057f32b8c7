"""docker-compose.yml and the Dockerfile: the services, health checks and settings they name are
real. `docker compose config` validates the file where a compose client is installed."""
import os
import re
import shutil
import subprocess

import pytest
import yaml

from common.settings import Settings
from tests.support import ROOT

COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


def test_services_healthchecks_and_profiles(compose):
    services = compose["services"]
    ha = {"redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"}
    assert set(services) == {"redis", "api", "worker-cpu", "worker-gpu", "worker-control", "flower"} | ha
    assert all("healthcheck" in svc for svc in services.values())
    assert services["worker-gpu"]["profiles"] == ["gpu"]
    assert all(services[name]["profiles"] == ["ha"] for name in ha)
    assert all("profiles" not in svc for name, svc in services.items() if name not in ha | {"worker-gpu"})
    for name in ("redis", "redis-replica"):  # durable, and never evicting queued jobs
        assert {"noeviction", "--appendonly", "everysec"} <= set(services[name]["command"]), name
    assert "--replicaof" in services["redis-replica"]["command"]
    for name in ("sentinel-1", "sentinel-2", "sentinel-3"):
        assert "sentinel monitor llmq redis 6379 2" in services[name]["command"][-1]
    api_cmd = " ".join(services["api"]["command"])
    assert "gunicorn" in api_cmd and "ops/gunicorn.conf.py" in api_cmd and "api.wsgi:app" in api_cmd
    assert services["api"]["ulimits"]["nofile"]["soft"] >= 20_000  # a socket per open stream
    assert "flower" in services["flower"]["command"]
    assert services["worker-gpu"]["environment"]["LLMQ_ENGINE"] == "vllm"
    assert services["worker-control"]["command"][:3] == ["python3", "-m", "worker.control"]
    assert "llmq-control@" in services["worker-control"]["healthcheck"]["test"][1]


def test_model_cache_is_one_volume_shared_by_api_and_workers(compose):
    assert "models" in compose["volumes"]
    for name in ("api", "worker-cpu", "worker-gpu"):
        assert "models:/models" in compose["services"][name]["volumes"], name
        assert compose["services"][name]["environment"]["LLMQ_MODEL_CACHE_DIR"] == "/models"


def test_every_llmq_variable_is_a_setting(compose):
    """A misspelt LLMQ_* variable would be silently ignored; check each against Settings."""
    fields = {f"LLMQ_{name.upper()}" for name in Settings.model_fields}
    named = set(re.findall(r"\b(LLMQ_[A-Z0-9_]+)", COMPOSE.read_text()))
    assert named and named <= fields, named - fields


def test_dockerfile_targets_and_commands():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM .* AS cpu$", text, re.M) and re.search(r"^FROM .* AS gpu$", text, re.M)
    assert "--index-url" in text  # the CPU build of torch, never the CUDA one, in the cpu image
    for module in ("api", "common", "worker"):
        assert f"COPY {module} ./{module}" in text


def _compose_cli() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.parametrize("profile", [None, "gpu", "ha"])
def test_docker_compose_config_validates(profile):
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no docker compose client installed")
    args = cli + (["--profile", profile] if profile else []) + ["-f", str(COMPOSE), "config", "-q"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_")}
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
