"""bench/gpu_check.sh where there is no GPU: its arguments, the preflight that stops it at once
(no GPU, too few GPUs, vLLM not importable) and the one result file it writes whatever happens;
bench/gpu_report.py's headline from result files of bench.bench's shape. The script and the
report's command line run for real, as subprocesses, as the script calls them; a stand-in
`nvidia-smi` on PATH plays the GPUs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.support import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.sh"
H100 = "NVIDIA H100 80GB HBM3, 81559 MiB"
PHASES = ["preflight", "install", "vllm", "gpu_tests", "side_by_side", "batching"]  # in the report's order


def run_check(*args: str, path: str | None = None, **env: str) -> subprocess.CompletedProcess:
    """The script, as a user runs it; 30 s is far beyond what failing a preflight takes."""
    full_env = {**os.environ, "PYTHON": sys.executable, **env}
    if path is not None:
        full_env["PATH"] = path
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=30)


def the_report(out: Path) -> dict:
    files = list(out.glob("gpu-check-*.json"))
    assert len(files) == 1, f"one result file expected in {out}: {files}"
    return json.loads(files[0].read_text())


def phases(report: dict) -> dict[str, dict]:
    return {p["name"]: p for p in report["phases"]}


def path_without_nvidia_smi() -> str:
    dirs = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    if not any((Path(d) / "bash").exists() for d in dirs):
        pytest.skip("nvidia-smi shares a directory with bash here")
    return os.pathsep.join(dirs)


def path_with_gpus(tmp_path: Path, count: int) -> str:
    """PATH with an `nvidia-smi` first that lists `count` H100s, whatever it is asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + f"echo '{H100}'\n" * count)
    smi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{path_without_nvidia_smi()}"


# --- arguments ------------------------------------------------------------------------------------
def test_help_lists_every_option_and_exits_0():
    result = run_check("--help")
    assert result.returncode == 0, result.stderr
    for option in ["--out", "--model", "--tensor-parallel", "--pipeline-parallel", "--skip-install",
                   "--budget-s"]:
        assert option in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--frobnicate"], "unknown option: --frobnicate"),
    (["--tensor-parallel"], "--tensor-parallel needs a value"),
    (["--budget-s", "ten"], "not a positive whole number: ten"),
])
def test_bad_arguments_exit_2_with_a_message_and_write_nothing(tmp_path, args, message):
    result = run_check("--out", str(tmp_path / "out"), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


# --- preflight ------------------------------------------------------------------------------------
def test_without_a_gpu_it_stops_at_once_and_still_writes_the_report(tmp_path):
    result = run_check("--out", str(tmp_path), path=path_without_nvidia_smi())
    assert result.returncode == 1
    assert "no CUDA GPU" in result.stderr
    assert "FAILED preflight" in result.stdout.splitlines()[-1]  # the summary line
    report = the_report(tmp_path)
    assert report["ok"] is False and report["failed_phases"] == ["preflight"]
    assert "no CUDA GPU" in phases(report)["preflight"]["reason"]
    assert [p["name"] for p in report["phases"]] == PHASES
    assert all(p["status"] == "skipped" for p in report["phases"][1:])  # no install was tried
    assert report["machine"]["gpu_count"] == 0
    assert report["headline"] == {"side_by_side": None, "batching": None}


def test_a_layout_wider_than_the_machine_fails_preflight_naming_the_gpus_needed(tmp_path):
    result = run_check("--out", str(tmp_path), "--tensor-parallel", "4", path=path_with_gpus(tmp_path, 2))
    assert result.returncode == 1
    assert "needs 4 GPUs" in result.stderr and "lists 2" in result.stderr
    report = the_report(tmp_path)
    assert report["layout"] == {"tensor_parallel": 4, "pipeline_parallel": 1, "gpus_needed": 4}
    assert report["machine"]["gpu_count"] == 2
    assert report["machine"]["gpus"][0] == {"name": "NVIDIA H100 80GB HBM3", "memory": "81559 MiB"}
    assert phases(report)["preflight"]["status"] == "failed"
    assert "needs 4 GPUs" in phases(report)["preflight"]["reason"]


def needs_the_scripts_redis() -> None:
    """Past its GPU checks the script wants a Redis on 127.0.0.1:6379 and starts one if there is
    none: these tests use a running one and start none."""
    try:
        redis.Redis(host="127.0.0.1", port=6379, socket_timeout=2).ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")


def test_vllm_not_importable_stops_the_check_after_a_passed_preflight(tmp_path):
    needs_the_scripts_redis()
    stand_in = tmp_path / "site" / "vllm"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text('raise ImportError("vllm stand-in: not installed")\n')
    result = run_check("--out", str(tmp_path / "out"), "--skip-install", "--tensor-parallel", "2",
                       path=path_with_gpus(tmp_path, 2), PYTHONPATH=str(tmp_path / "site"))
    assert result.returncode == 1
    assert "vLLM or CUDA not usable" in result.stderr and "vllm stand-in" in result.stderr
    found = phases(the_report(tmp_path / "out"))
    assert found["preflight"]["status"] == "ok"
    assert found["install"]["status"] == "skipped"
    assert found["vllm"]["status"] == "failed" and "vllm stand-in" in found["vllm"]["reason"]
    assert {found[name]["status"] for name in ["gpu_tests", "side_by_side", "batching"]} == {"skipped"}


def test_a_phase_past_its_share_of_the_budget_is_stopped_and_reported_timed_out(tmp_path):
    """--budget-s 70 without install gives the vLLM check 6 s (10 / 105 of the 63-69 s left after
    preflight; the weights are in bench/gpu_check.sh). A stand-in Python
    that never answers it (the report's own calls go to the real one) must be stopped, its
    process gone, the phase timed out and the check ended."""
    needs_the_scripts_redis()
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/bash
if [[ $1 == -m && $2 == bench.gpu_report ]]; then exec {sys.executable} "$@"; fi
echo $$ > {tmp_path}/stand_in.pid
exec sleep 120
""")
    python.chmod(0o755)
    result = run_check("--out", str(tmp_path / "out"), "--skip-install", "--budget-s", "70",
                       path=path_with_gpus(tmp_path, 1), PYTHON=str(python))
    assert result.returncode == 1
    vllm = phases(the_report(tmp_path / "out"))["vllm"]
    assert vllm["status"] == "timed_out" and vllm["reason"].startswith("no end within 6s")
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "stand_in.pid").read_text()), 0)


# --- the headline, from result files of bench.bench's shape ---------------------------------------
def gpu_report(*args: str) -> subprocess.CompletedProcess:
    """`python -m bench.gpu_report ...`, as bench/gpu_check.sh calls it."""
    return subprocess.run([sys.executable, "-m", "bench.gpu_report", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)


def rows(*levels: tuple[int, int, int, float, int]) -> list[dict]:
    """bench.bench's summary rows (bench/harness/stats.py's `summarize`) as the report reads
    them: per level (clients, requests, tokens each, wall s, failed); tokens/s counts the
    requests that did not fail."""
    return [{"clients": clients, "requests": requests, "failed": failed, "wall_s": wall,
             "tokens_per_s": round((requests - failed) * tokens / wall, 1)}
            for clients, requests, tokens, wall, failed in levels]


def bench_output(folder: Path, levels: list[int], results: dict) -> Path:
    """A `compare-<time>.json` as `bench.bench --openai` writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "compare-20260101-120000.json"
    path.write_text(json.dumps({"args": {"levels": str(levels), "openai": "True", "engines": "vllm"},
                                "results": results}))
    return path


def report_of(tmp_path: Path, passed: list[str], **bench: Path) -> dict:
    """A report started, with these phases passed, finished with these benchmarks' folders."""
    file = tmp_path / "gpu-check.json"
    gpu_report("start", file, "--model", "embedded", "--tensor-parallel", 1, "--pipeline-parallel", 1,
               "--budget-s", 600, "--gpus", H100).check_returncode()
    for name in passed:
        gpu_report("phase", "--", file, name, "ok", 100).check_returncode()
    gpu_report("finish", file, *[arg for name, folder in bench.items() for arg in ("--bench", f"{name}={folder}")])
    return json.loads(file.read_text())


def test_side_by_side_headline_is_tokens_per_s_per_level_and_llmq_over_vllm(tmp_path):
    source = bench_output(tmp_path / "sbs", [1, 16], {
        "llmq-vllm": rows((1, 8, 100, 2.0, 0), (16, 16, 100, 4.0, 0)),       # 400, 400 tok/s
        "vllm-server": rows((1, 8, 100, 1.6, 0), (16, 16, 100, 3.2, 0))})    # 500, 500 tok/s
    report = report_of(tmp_path, ["side_by_side"], side_by_side=tmp_path / "sbs")
    headline = report["headline"]["side_by_side"]
    assert headline["source"] == str(source)
    assert headline["levels"] == [
        {"clients": 1, "llmq_tokens_per_s": 400.0, "vllm_server_tokens_per_s": 500.0, "ratio": 0.8},
        {"clients": 16, "llmq_tokens_per_s": 400.0, "vllm_server_tokens_per_s": 500.0, "ratio": 0.8}]
    assert headline["failed_requests"] == 0
    assert phases(report)["side_by_side"]["status"] == "ok"


def test_batching_gain_is_the_batched_stack_over_batch_1(tmp_path):
    bench_output(tmp_path / "batching", [128], {
        "llmq-vllm": rows((128, 128, 64, 4.0, 0)),     # 2048 tok/s
        "llmq-b1": rows((128, 128, 64, 64.0, 0))})     # 128 tok/s
    report = report_of(tmp_path, ["batching"], batching=tmp_path / "batching")
    headline = report["headline"]["batching"]
    assert headline["batch_size"] == 128
    assert headline["levels"] == [{"clients": 128, "batched_tokens_per_s": 2048.0,
                                   "batch_1_tokens_per_s": 128.0, "gain": 16.0}]


def test_a_benchmark_that_exited_0_with_failed_requests_or_no_file_is_a_failed_phase(tmp_path):
    bench_output(tmp_path / "sbs", [64], {
        "llmq-vllm": rows((64, 64, 100, 4.0, 3)), "vllm-server": rows((64, 64, 100, 4.0, 0))})
    report = report_of(tmp_path, PHASES, side_by_side=tmp_path / "sbs", batching=tmp_path / "none")
    found = phases(report)
    assert found["side_by_side"]["status"] == "failed" and "3 requests failed" in found["side_by_side"]["reason"]
    assert found["batching"]["status"] == "failed" and "no compare-*.json" in found["batching"]["reason"]
    assert report["headline"]["side_by_side"]["failed_requests"] == 3  # the figures stay, marked
    assert report["failed_phases"] == ["side_by_side", "batching"] and report["ok"] is False


def test_cli_as_the_script_calls_it_exits_0_only_when_every_phase_passed(tmp_path):
    bench_output(tmp_path / "sbs", [1], {"llmq-vllm": rows((1, 8, 100, 2.0, 0)),
                                         "vllm-server": rows((1, 8, 100, 2.0, 0))})
    bench_output(tmp_path / "batching", [128], {"llmq-vllm": rows((128, 128, 64, 4.0, 0)),
                                                "llmq-b1": rows((128, 128, 64, 32.0, 0))})
    file = tmp_path / "gpu-check.json"
    assert gpu_report("start", file, "--model", "embedded", "--tensor-parallel", "1",
                      "--pipeline-parallel", "1", "--budget-s", "600", "--gpus", H100).returncode == 0
    for name in PHASES:
        assert gpu_report("phase", "--", file, name, "ok", "12.5", "-starts with a dash").returncode == 0
    finish = ["finish", file, "--bench", f"side_by_side={tmp_path / 'sbs'}",
              "--bench", f"batching={tmp_path / 'batching'}"]
    done = gpu_report(*finish)
    assert done.returncode == 0
    assert "every phase passed" in done.stdout
    report = json.loads(file.read_text())
    assert report["ok"] is True and report["headline"]["batching"]["levels"][0]["gain"] == 8.0
    assert report["phases"][0] == {"name": "preflight", "status": "ok", "seconds": 12.5,
                                   "reason": "-starts with a dash"}

    gpu_report("phase", "--", file, "gpu_tests", "timed_out", "90", "no end within 90s")
    done = gpu_report(*finish)
    assert done.returncode == 1
    assert "FAILED gpu_tests (timed_out: no end within 90s)" in done.stdout
