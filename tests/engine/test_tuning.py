"""The engine and weights a worker serves with when they are `auto`: what `python -m worker.tune`
measured on this host for this model and batch size, else the defaults; and the measurement
itself, end to end, with a worker that then serves with its winner."""
import json
import subprocess
import sys

import pytest
import requests

from api import create_app
from common.prompting import PromptBuilder
from tests.support import ROOT
from tests.support.servers import LiveServer
from tests.support.settings import cleanup_namespace, make_settings, settings_env
from tests.support.waiting import wait_until
from worker.engine.registry import choose_engine
from worker.tune import PROMPTS, Prompts
from worker.tuning import CLOSE_ENOUGH, Candidate, choose, host_signature, read_record, resolve, write_record

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture
def tuned(tmp_path):
    return make_settings(tuning_dir=tmp_path, engine="auto", weights="auto", max_batch_size=4)


def test_without_a_measurement_auto_is_the_default(tuned):
    settings, choice = resolve(tuned, MODEL)
    assert (settings.engine, settings.weights) == (choose_engine("auto"), "int8")
    assert choice["by"] == "settings" and "worker.tune" in choice["why"]


def test_a_measurement_on_this_host_decides_auto(tuned):
    write_record(tuned, MODEL, 4, {"openvino:int8": 100.0, "openvino:bf16": 150.0}, Candidate("openvino", "bf16"))
    settings, choice = resolve(tuned, MODEL)
    assert (settings.engine, settings.weights, choice["by"]) == ("openvino", "bf16", "tuning")
    assert "openvino:bf16 150.0" in choice["why"]
    # what is asked for explicitly stays: the engine, and the weights
    assert resolve(tuned.model_copy(update={"weights": "int4"}), MODEL)[0].weights == "int4"
    hf = resolve(tuned.model_copy(update={"engine": "hf"}), MODEL)
    assert hf[0].engine == "hf" and hf[0].weights == "int8" and hf[1]["by"] == "settings"


def test_a_measurement_with_long_prompts_says_so(tuned):
    write_record(tuned, MODEL, 4, {"openvino:int8": 20.0, "vllm": 30.0}, Candidate("vllm", "-"), prompt_tokens=1500)
    settings, choice = resolve(tuned, MODEL)
    assert settings.engine == "vllm" and "prompts of about 1500 tokens" in choice["why"]


def test_long_prompts_are_about_the_size_asked_and_each_its_own(model_ref):
    builder = PromptBuilder(model_ref.path, 4096)
    short = Prompts(builder)
    questions = [builder.build([{"role": "user", "content": p}], None)[1] for p in PROMPTS]
    assert [short.next() for _ in PROMPTS] == questions
    long = Prompts(builder, 1500)
    prompts = [long.next() for _ in range(6)]
    assert all(1350 <= len(ids) <= 1650 for ids in prompts), [len(ids) for ids in prompts]
    # no two share a start a prefix cache could reuse: they differ within the first few tokens
    assert len({tuple(ids[:12]) for ids in prompts}) == len(prompts)


@pytest.mark.parametrize("change", [{"host": "another CPU"}, {"clients": 16}])
def test_a_measurement_from_another_host_or_batch_size_is_not_used(tuned, change):
    path = write_record(tuned, MODEL, 4, {"vllm": 300.0}, Candidate("vllm", "-"))
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    assert read_record(tuned, MODEL) is None
    assert resolve(tuned, MODEL)[1]["by"] == "settings"
    assert host_signature()  # names this CPU


@pytest.mark.slow
def test_tune_measures_and_a_worker_serves_with_the_winner(tmp_path, start_worker, model_ref):
    settings = make_settings(tuning_dir=tmp_path, engine="auto", weights="auto", max_batch_size=2)
    out = subprocess.run([sys.executable, "-m", "worker.tune", "--seconds", "2", "--max-tokens", "16",
                          "--candidates", "hf,openvino:int8"], cwd=ROOT, env=settings_env(settings),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    record = read_record(settings, model_ref.name)
    assert set(record["tokens_per_s"]) == {"hf", "openvino:int8"} and all(record["tokens_per_s"].values())
    winner = Candidate(**record["winner"])
    speeds = record["tokens_per_s"]
    assert winner.label == "openvino:int8" and speeds["openvino:int8"] == max(speeds.values()) or \
        winner.label == "hf" and speeds["hf"] >= (1 - CLOSE_ENOUGH) * max(speeds.values())
    start_worker(settings)
    server = LiveServer(create_app(settings))
    try:
        def detail():
            workers = requests.get(f"{server.url}/health", timeout=10).json()["workers_detail"]
            return workers[0] if workers else None
        wait_until(detail, timeout=60)
        worker = detail()
        assert worker["engine"] == winner.engine and worker["engine_choice"]["by"] == "tuning"
        assert "worker.tune" in worker["engine_choice"]["why"]
    finally:
        server.stop()
        cleanup_namespace(settings)


def test_a_lead_within_measurement_noise_keeps_the_preferred_candidate(tuned):
    int8, bf16, vllm = Candidate("openvino", "int8"), Candidate("openvino", "bf16"), Candidate("vllm", "-")
    # as measured on a 2-core AVX2 host at 16 clients: bf16 1.8% ahead of int8, a tie
    assert choose([int8, bf16, vllm], {"openvino:int8": 88.0, "openvino:bf16": 89.6, "vllm": 64.0}) == int8
    assert choose([int8, bf16, vllm], {"openvino:int8": 88.0, "openvino:bf16": 95.0, "vllm": 64.0}) == bf16
    assert choose([vllm, int8], {"openvino:int8": 88.0, "vllm": 85.0}) == vllm  # the order given is the preference
    write_record(tuned, MODEL, 4, {"openvino:int8": 88.0, "openvino:bf16": 89.6}, int8)
    settings, choice = resolve(tuned, MODEL)
    assert settings.weights == "int8" and "preferred within 5% of the fastest" in choice["why"]
