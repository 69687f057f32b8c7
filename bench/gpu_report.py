"""The GPU check's one result file (bench/gpu_check.sh writes it through this module's CLI).

The check runs on a machine lent for minutes, so whatever happens (no GPU, a phase that times out,
a benchmark that crashes) one JSON file must say how far it got and, where the benchmarks ran,
the headline: tokens/s of llmq on vLLM against vLLM's own server per level, and batching's gain.

    python -m bench.gpu_report start FILE --model NAME --tensor-parallel N --pipeline-parallel M \
        --budget-s S [--gpus "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"]
    python -m bench.gpu_report phase -- FILE NAME STATUS SECONDS [REASON]   (`--`: a reason may start with -)
    python -m bench.gpu_report finish FILE [--bench side_by_side=DIR] [--bench batching=DIR]

`finish` reads the compare-*.json that `python -m bench.bench --openai` wrote into each phase's
folder (of each server's rows, one per level as bench/harness/stats.py's `summarize` makes them, it
reads `clients`, `tokens_per_s` and `failed`), adds the headline, prints one summary line and exits
1 if any phase failed or timed out.
Standard library only: it must run before the install phase and where the install failed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

PHASES = ["preflight", "install", "vllm", "gpu_tests", "side_by_side", "batching"]
STATUSES = ["ok", "failed", "timed_out", "skipped"]
# bench.bench's names for its servers: the llmq stack per engine, vLLM's own server, and the
# variant gpu_check.sh asks for with `--variant b1:LLMQ_MAX_BATCH_SIZE=1`
LLMQ, VLLM_SERVER, BATCH_1 = "llmq-vllm", "vllm-server", "llmq-b1"


def parse_gpus(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader` lines as dicts."""
    gpus = []
    for line in text.splitlines():
        if line.strip():
            name, _, memory = line.rpartition(",") if "," in line else (line, "", "")
            gpus.append({"name": name.strip(), "memory": memory.strip() or None})
    return gpus


def new_report(model: str, tensor_parallel: int, pipeline_parallel: int, budget_s: int,
               gpus_text: str = "") -> dict:
    gpus = parse_gpus(gpus_text)
    return {
        "check": "bench/gpu_check.sh",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "finished": None,
        "ok": None,
        "model": model,
        "budget_s": budget_s,
        "layout": {"tensor_parallel": tensor_parallel, "pipeline_parallel": pipeline_parallel,
                   "gpus_needed": tensor_parallel * pipeline_parallel},
        "machine": {"host": socket.gethostname(), "gpu_count": len(gpus), "gpus": gpus},
        "phases": [],
        "headline": {"side_by_side": None, "batching": None},
        "failed_phases": [],
    }


def add_phase(report: dict, name: str, status: str, seconds: float, reason: str = "") -> None:
    """One phase's outcome; a phase recorded again (interrupted after its end) keeps the last."""
    if status not in STATUSES:
        raise ValueError(f"phase status {status!r} is not one of {STATUSES}")
    report["phases"] = [p for p in report["phases"] if p["name"] != name]
    report["phases"].append({"name": name, "status": status, "seconds": round(seconds, 1),
                             "reason": " ".join(reason.split())[:300]})


def bench_json(folder: Path) -> tuple[dict | None, str]:
    """The newest compare-*.json bench.bench wrote into `folder`, with its path (or why none)."""
    files = sorted(Path(folder).glob("compare-*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        return None, f"no compare-*.json in {folder}"
    return json.loads(files[-1].read_text()), str(files[-1])


def _ratio(ours: float, theirs: float) -> float | None:
    return round(ours / theirs, 3) if theirs else None


def _failed(results: dict, *names: str) -> int:
    return sum(row["failed"] for name in names for row in results.get(name, []))


def side_by_side(data: dict) -> dict:
    """Per level: tokens/s of llmq on vLLM and of vLLM's own server, and llmq / vLLM."""
    results = data["results"]
    levels = [{"clients": o["clients"], "llmq_tokens_per_s": o["tokens_per_s"],
               "vllm_server_tokens_per_s": t["tokens_per_s"],
               "ratio": _ratio(o["tokens_per_s"], t["tokens_per_s"])}
              for o, t in zip(results[LLMQ], results[VLLM_SERVER])]
    return {"levels": levels, "failed_requests": _failed(results, LLMQ, VLLM_SERVER)}


def batching(data: dict) -> dict:
    """Per level: tokens/s of llmq on vLLM at its batch (bench.bench gives it the largest level)
    and of the same stack with a batch of one; their ratio is what batching gains."""
    results = data["results"]
    batch = max(row["clients"] for row in results[LLMQ])
    levels = [{"clients": b["clients"], "batched_tokens_per_s": b["tokens_per_s"],
               "batch_1_tokens_per_s": one["tokens_per_s"],
               "gain": _ratio(b["tokens_per_s"], one["tokens_per_s"])}
              for b, one in zip(results[LLMQ], results[BATCH_1])]
    return {"batch_size": batch, "levels": levels, "failed_requests": _failed(results, LLMQ, BATCH_1)}


HEADLINES = {"side_by_side": side_by_side, "batching": batching}


def finish(report: dict, bench_dirs: dict[str, Path]) -> dict:
    """Headline from the benchmarks' files; a benchmark phase that exited 0 without a usable file,
    or with failed requests, is failed (its figures are not a measurement). Phases never reached
    are listed as skipped, so the file always shows every phase."""
    phases = {p["name"]: p for p in report["phases"]}
    for name, folder in bench_dirs.items():
        data, source = bench_json(folder)
        try:
            figures = HEADLINES[name](data) if data else None
        except (KeyError, TypeError, ValueError) as exc:
            figures, source = None, f"{source}: unexpected shape ({exc!r})"
        if figures:
            report["headline"][name] = {"source": source, **figures}
        phase = phases.get(name)
        if phase and phase["status"] == "ok":
            if figures is None:
                phase.update(status="failed", reason=f"the benchmark wrote no figures: {source}")
            elif figures["failed_requests"]:
                phase.update(status="failed", reason=f"{figures['failed_requests']} requests failed")
    stopped = next((p["name"] for p in report["phases"] if p["status"] in ("failed", "timed_out")), None)
    for name in PHASES:
        if name not in phases:
            add_phase(report, name, "skipped", 0, f"not run: the check stopped after {stopped}"
                      if stopped else "not run")
    report["phases"].sort(key=lambda p: PHASES.index(p["name"]) if p["name"] in PHASES else len(PHASES))
    report["failed_phases"] = [p["name"] for p in report["phases"] if p["status"] in ("failed", "timed_out")]
    report["ok"] = not report["failed_phases"]
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return report


def summary(report: dict, path: Path) -> str:
    if report["ok"]:
        return f"gpu_check: every phase passed; report {path}"
    failed = ", ".join(f"{p['name']} ({p['status']}: {p['reason']})" for p in report["phases"]
                       if p["name"] in report["failed_phases"])
    return f"gpu_check: FAILED {failed}; report {path}"


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def save(report: dict, path: Path) -> None:
    """Written whole, then renamed: a check killed mid-write leaves the last complete report."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="a new report")
    start.add_argument("file", type=Path)
    start.add_argument("--model", required=True)
    start.add_argument("--tensor-parallel", type=int, required=True)
    start.add_argument("--pipeline-parallel", type=int, required=True)
    start.add_argument("--budget-s", type=int, required=True)
    start.add_argument("--gpus", default="", help="nvidia-smi's name,memory.total CSV lines")
    phase = commands.add_parser("phase", help="record one phase")
    phase.add_argument("file", type=Path)
    phase.add_argument("name", choices=PHASES)
    phase.add_argument("status", choices=STATUSES)
    phase.add_argument("seconds", type=float)
    phase.add_argument("reason", nargs="?", default="")
    end = commands.add_parser("finish", help="headline, summary line; exit 1 if a phase failed")
    end.add_argument("file", type=Path)
    end.add_argument("--bench", action="append", default=[], metavar="PHASE=DIR",
                     help=f"a benchmark phase ({', '.join(HEADLINES)}) and the folder of its output")
    args = parser.parse_args(argv)

    if args.command == "start":
        save(new_report(args.model, args.tensor_parallel, args.pipeline_parallel, args.budget_s,
                        args.gpus), args.file)
        return 0
    report = load(args.file)
    if args.command == "phase":
        add_phase(report, args.name, args.status, args.seconds, args.reason)
        save(report, args.file)
        return 0
    dirs = dict(item.split("=", 1) for item in args.bench)
    unknown = set(dirs) - set(HEADLINES)
    if unknown:
        parser.error(f"--bench names no benchmark phase: {', '.join(sorted(unknown))}")
    finish(report, {name: Path(folder) for name, folder in dirs.items()})
    save(report, args.file)
    print(summary(report, args.file))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
