"""What a benchmark reads from its command line and writes out: levels, result files, tables."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def levels(text: str) -> list[int]:
    """`--levels 1,8,16` as [1, 8, 16] (an argparse type)."""
    return [int(x) for x in text.split(",")]


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """`nice0:LLMQ_VLLM_RELAY_NICE=0,LLMQ_X=1` as ("nice0", {"LLMQ_VLLM_RELAY_NICE": "0", ...})."""
    name, _, changes = text.partition(":")
    return name, dict(change.split("=", 1) for change in changes.split(",") if change)


def args_dict(args: argparse.Namespace) -> dict[str, str]:
    """The arguments of a run, as text, for its result file."""
    return {k: str(v) for k, v in vars(args).items()}


def save(out: Path, name: str, payload) -> Path:
    """`<out>/<name>-<local time>.json`; its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path


def markdown_table(headers: list[str], rows: list[list], align: str = "") -> str:
    """A markdown table; `align` one letter a column, `r` for right-aligned (default left)."""
    rule = ["---:" if a == "r" else "---" for a in align.ljust(len(headers), "l")]
    lines = [headers, rule, *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)
