"""Nothing phones home (common/no_telemetry.py), run for real: OpenVINO's tools as the worker runs
its exporter keep no client id and consent to nothing; vLLM's usage report and huggingface_hub's
are off in a process started as llmq starts one and in what it starts; the ops scripts export
the same switches; the images, compose and Kubernetes carry the same list.

Each starts from what a user's fresh shell has: none of the switches set, a home of its own (no
earlier opt-out there), and no CI variable (OpenVINO's tools stay quiet in a CI on their own)."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
import yaml

from common.no_telemetry import OFF, decline_openvino_telemetry
from tests.support import ROOT
from tests.support.settings import make_settings

NOT_SET = [*OFF, "CI", "TF_BUILD", "JENKINS_URL", "XDG_CONFIG_HOME", "VLLM_CONFIG_ROOT"]

# What starts OpenVINO's telemetry in an export, without the export: NNCF starts it on import,
# the converter on each conversion (consent decided, client id written if consented).
OPENVINO_TRIGGER = """
import nncf
from openvino.tools.ovc.telemetry_utils import init_ovc_telemetry
print(init_ovc_telemetry().consent)
"""

# An llmq entry module imported as `python -m` starts it (its main() not run), then what vLLM
# decides and what a process it starts (an engine core) inherits.
USAGE_PROBE = """
import importlib, json, os, subprocess, sys
importlib.import_module(sys.argv[1])
import huggingface_hub.constants as hub
from vllm.usage.usage_lib import is_usage_stats_enabled
child = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                       capture_output=True, text=True, check=True)
print(json.dumps({"vllm_reports": is_usage_stats_enabled(), "hub_off": hub.HF_HUB_DISABLE_TELEMETRY,
                  "child_env": json.loads(child.stdout)}))
"""


@pytest.fixture
def fresh_shell(tmp_path, monkeypatch):
    """This process's environment as a user's fresh shell has it, with `tmp_path` as home."""
    for name in NOT_SET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_openvino_tools_run_as_the_worker_runs_its_exporter_keep_no_id_and_consent_to_nothing(fresh_shell):
    from worker.engine.openvino_model import exporter_python, run_exporter

    python = exporter_python(make_settings())
    if not python.exists():
        pytest.skip(f"no OpenVINO exporter at {python} (install_openvino_exporter in ops/common.sh)")
    done = run_exporter([str(python), "-c", OPENVINO_TRIGGER])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"  # no consent: nothing is sent
    # OpenVINO's opt-out, and neither its client id (openvino_ga_cid) nor its usage counts (stats)
    assert {p.name: p.read_text() for p in (fresh_shell / "intel").iterdir()} == {"openvino_telemetry": "0"}


def test_an_openvino_choice_already_made_is_left_as_it_is(tmp_path):
    (tmp_path / "intel").mkdir()
    (tmp_path / "intel" / "openvino_telemetry").write_text("1")  # `opt_in_out --opt_in`
    assert decline_openvino_telemetry(tmp_path)
    assert (tmp_path / "intel" / "openvino_telemetry").read_text() == "1"


@pytest.mark.slow  # imports vLLM (seconds)
@pytest.mark.parametrize("entry", ["worker.__main__", "worker.control", "api.__main__", "common.models"])
def test_vllm_and_the_hub_report_nothing_from_an_llmq_process_or_what_it_starts(fresh_shell, entry):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    done = subprocess.run([sys.executable, "-c", USAGE_PROBE, entry], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["vllm_reports"] is False and seen["hub_off"] is True
    assert {name: seen["child_env"].get(name) for name in OFF} == OFF


def test_the_ops_scripts_export_every_switch_and_decline_openvino(fresh_shell):
    done = subprocess.run(["bash", "-c", "source ops/common.sh; env -0"], cwd=ROOT, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    env = dict(line.split("=", 1) for line in done.stdout.decode().split("\0") if "=" in line)
    assert {name: env.get(name) for name in OFF} == OFF
    assert (fresh_shell / "intel" / "openvino_telemetry").read_text() == "0"


def test_the_images_compose_and_kubernetes_carry_the_same_switches():
    stages = re.split(r"^FROM ", (ROOT / "Dockerfile").read_text(), flags=re.M)[1:]
    assert len(stages) == 2
    for stage in stages:
        env = dict(re.findall(r"(\w+)=(\S+)", " ".join(re.findall(r"^ENV (.+)$", stage, re.M))))
        assert {name: env.get(name) for name in OFF} == OFF, stage.splitlines()[0]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {name: compose["x-llmq-env"].get(name) for name in OFF} == OFF
    config = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "config.yaml").read_text())
    data = next(doc for doc in config if doc["kind"] == "ConfigMap")["data"]
    assert {name: data.get(name) for name in OFF} == OFF
