"""Which engine and weights serve a model on this host: measured (`python -m worker.tune`), not
assumed.

The fastest choice depends on the CPU (bf16 weights where AMX computes them natively, int8 where
memory bandwidth is what counts), on the model's size and on how many requests run at once, so
the default can only be a guess. `python -m worker.tune` measures the candidates here and records
the winner per model and host; a worker whose `LLMQ_ENGINE` or `LLMQ_WEIGHTS` is `auto` then
serves with it, and its heartbeat (so `/health`) says what was chosen and why. Only weight
formats whose quality docs/engines.md accepts are candidates (int8 and bf16, not int4 or the raw
GGUF). A record made on another CPU, or for another concurrency, is not used.
"""
from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from common.settings import Settings
from worker.engine.openvino_model import DEFAULT_WEIGHTS
from worker.engine.registry import choose_engine


@dataclass(frozen=True)
class Candidate:
    engine: str
    weights: str  # OpenVINO's weight format; "-" for engines that take the model's own dtype

    @property
    def label(self) -> str:
        return self.engine if self.weights == "-" else f"{self.engine}:{self.weights}"

    @classmethod
    def parse(cls, label: str) -> "Candidate":
        engine, _, weights = label.partition(":")
        return cls(engine, weights or ("int8" if engine == "openvino" else "-"))


CLOSE_ENOUGH = 0.05  # a candidate this much slower than the fastest ties with it


def choose(candidates: list[Candidate], results: dict[str, float]) -> Candidate:
    """The first of `candidates` (in order of preference) within `CLOSE_ENOUGH` of the fastest.
    Two runs of one candidate on a shared host differ by about that much, so a smaller lead is no
    reason to leave the preferred choice: the defaults come int8 first, which takes half the memory
    of bf16 and none of vLLM's start-up."""
    fastest = max(results[c.label] for c in candidates)
    return next(c for c in candidates if results[c.label] >= fastest * (1 - CLOSE_ENOUGH))


def host_signature() -> str:
    """The CPU this runs on: its model name and whether it has AMX, which decide the winner."""
    name, flags = platform.processor() or "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    return f"{name}{' +amx' if 'amx_bf16' in flags else ''}"


def record_path(settings: Settings, model_name: str) -> Path:
    folder = settings.tuning_dir or settings.model_cache_dir / "tuning"
    return folder / f"{model_name.replace('/', '--')}.json"


def write_record(settings: Settings, model_name: str, clients: int, results: dict[str, float],
                 winner: Candidate, prompt_tokens: int = 0) -> Path:
    path = record_path(settings, model_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": model_name, "host": host_signature(), "clients": clients,
                                "prompt_tokens": prompt_tokens,
                                "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "tokens_per_s": results, "winner": asdict(winner)}, indent=2))
    return path


def read_record(settings: Settings, model_name: str) -> dict | None:
    """This model's record, if it was measured on this CPU at this deployment's concurrency."""
    try:
        record = json.loads(record_path(settings, model_name).read_text())
    except (OSError, ValueError):
        return None
    if record.get("host") != host_signature() or record.get("clients") != settings.max_batch_size:
        return None
    return record


def resolve(settings: Settings, model_name: str) -> tuple[Settings, dict]:
    """`settings` with a concrete engine and weights, and why they were chosen (for /health)."""
    wants_engine, wants_weights = settings.engine == "auto", settings.weights == "auto"
    record = read_record(settings, model_name) if wants_engine or wants_weights else None
    winner = Candidate(**record["winner"]) if record else None
    if winner and not wants_engine and winner.engine != settings.engine:
        winner = None  # measured for another engine: the engine asked for keeps its default weights
    engine = winner.engine if winner and wants_engine else choose_engine(settings.engine)
    weights = settings.weights
    if wants_weights:
        weights = winner.weights if winner and winner.weights != "-" else DEFAULT_WEIGHTS
    if winner:
        speeds = ", ".join(f"{k} {v:.1f}" for k, v in record["tokens_per_s"].items())
        prompts = (f" with prompts of about {record['prompt_tokens']} tokens" if record.get("prompt_tokens")
                   else "")
        tie = ("" if record["tokens_per_s"][winner.label] >= max(record["tokens_per_s"].values()) else
               f"; {winner.label} is preferred within {CLOSE_ENOUGH:.0%} of the fastest")
        why = (f"measured by `python -m worker.tune` on {record['measured_at']} at {record['clients']} "
               f"clients{prompts} (tokens/s: {speeds}{tie})")
    elif wants_engine or wants_weights:
        why = "the default: no measurement for this model, host and batch size (python -m worker.tune)"
    else:
        why = "set by LLMQ_ENGINE and LLMQ_WEIGHTS"
    choice = {"engine": engine, "weights": weights, "by": "tuning" if winner else "settings", "why": why}
    return settings.model_copy(update={"engine": engine, "weights": weights}), choice
