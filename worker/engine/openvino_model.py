"""What the OpenVINO engine serves: a model exported once to OpenVINO IR, or a GGUF file as it is.

A model is exported once with optimum-intel, at `LLMQ_WEIGHTS` (int8 by default), from its
Hugging Face folder (for a GGUF model, the float folder `common.models` converted it to) into
the model cache. OpenVINO GenAI can also read a GGUF file directly (`LLMQ_WEIGHTS=gguf`): it
starts without an export, but its reading of the embedded Q4_1 file drifts from the model's float
weights as far as an int4 export does, while int8 stays as close as bf16 compute itself
(docs/engines.md), hence the default. Where no exporter is installed, a GGUF model is still
served from its file.

optimum-intel pins an older transformers than vLLM's CPU build needs, so the exporter lives in an
environment of its own (`.venv-export`, made by `install_openvino_exporter` in ops/common.sh) and
runs as a subprocess; the worker's own environment needs only `openvino-genai`. Whatever cannot
be read or exported raises `OpenVINOUnavailable`, and the worker falls back to the HF engine.
OpenVINO's tools there report usage unless declined: `run_exporter` declines it first
(common/no_telemetry.py).
"""
from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

from common.models import ModelRef, build_once
from common.no_telemetry import decline_openvino_telemetry
from worker.engine.protocol import EngineUnavailable

log = logging.getLogger(__name__)
DEFAULT_WEIGHTS = "int8"  # the measured-quality default (module docstring) where nothing was tuned

# optimum-cli's arguments per weight format. int8: every layer at 8 bits per output channel,
# symmetric (no zero point): as close to the float model as the asymmetric default and faster to
# decode where the CPU has no int8 dot product (docs/engines.md); int4: every layer at 4 bits in
# groups of 64 (the format measured in docs/engines.md); bf16: 16-bit float weights, computed in
# bf16 where the CPU has native BF16.
EXPORT_FORMATS = {
    "int8": ["--weight-format", "int8", "--sym"],
    "int4": ["--weight-format", "int4", "--group-size", "64", "--ratio", "1.0"],
    "bf16": ["--weight-format", "fp16"],
}
# The folder of a format's export, where it is not the format's name: a format whose arguments
# change takes a new folder, so that an IR exported with the old ones is not served as the new.
EXPORT_FOLDERS = {"int8": "int8-sym"}


class OpenVINOUnavailable(EngineUnavailable):
    """The OpenVINO engine cannot serve this model here (not installed, unreadable, not exported)."""


def build(settings, model: ModelRef):
    """The OpenVINO engine for the worker, and what the heartbeat says of it (its weights, source,
    dtype and KV capacity)."""
    engine = open_engine(model, settings)
    return engine, engine.info


def open_engine(model: ModelRef, settings):
    """The OpenVINO engine on what `choose_source` picks (a GGUF file it cannot read: its export).
    Weights still `auto` here (an engine built outside a worker, which resolves them with
    worker/tuning.py) are the measured-quality default."""
    settings = _concrete_weights(settings)
    from worker.engine.openvino_engine import OpenVINOEngine

    if importlib.util.find_spec("openvino_genai") is None:  # found, not imported: only the core loads it
        raise OpenVINOUnavailable("openvino-genai is not installed")
    source, weights = choose_source(model, settings)
    try:
        return OpenVINOEngine.from_source(source, model.path, settings, {"weights": weights, "source": str(source)})
    except RuntimeError as exc:  # an architecture or quantization its GGUF reader lacks, a broken IR
        if source != model.gguf or not can_export(model, settings.model_copy(update={"weights": "int8"})):
            raise OpenVINOUnavailable(f"OpenVINO cannot load {source}: {exc}") from exc
        log.warning("OpenVINO cannot read %s (%s); exporting it instead", source.name, str(exc).splitlines()[0])
    settings = settings.model_copy(update={"weights": "int8" if settings.weights == "gguf" else settings.weights})
    ir = ensure_exported(model, settings)
    try:
        return OpenVINOEngine.from_source(ir, model.path, settings, {"weights": settings.weights, "source": str(ir)})
    except RuntimeError as exc:
        raise OpenVINOUnavailable(f"OpenVINO cannot load {ir}: {exc}") from exc


def _concrete_weights(settings):
    return settings.model_copy(update={"weights": DEFAULT_WEIGHTS}) if settings.weights == "auto" else settings


def choose_source(model: ModelRef, settings) -> tuple[Path, str]:
    """What to serve and its weight format: the model's IR at `settings.weights` (exported now if
    need be), or its GGUF file when asked for (`gguf`) or when there is no exporter."""
    settings = _concrete_weights(settings)
    if model.gguf is not None and (settings.weights == "gguf" or not can_export(model, settings)):
        return model.gguf, gguf_weights(model.gguf)
    if settings.weights == "gguf":
        log.warning("LLMQ_WEIGHTS=gguf: %s has no GGUF file; exporting it with int8 weights", model.name)
        settings = settings.model_copy(update={"weights": "int8"})
    return ensure_exported(model, settings), settings.weights


def gguf_weights(path: Path) -> str:
    """The GGUF file's weight type as llama.cpp names it (e.g. 'Q4_1'), for /health."""
    import gguf

    field = gguf.GGUFReader(path).fields.get("general.file_type")
    if field is None:
        return "gguf"
    return gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name.removeprefix("MOSTLY_")


def exported_dir(model: ModelRef, settings) -> Path:
    folder = EXPORT_FOLDERS.get(settings.weights, settings.weights)
    return settings.model_cache_dir / "openvino" / f"{model.disk_name.replace('/', '--')}-{folder}"


def exporter_python(settings) -> Path:
    return settings.openvino_export_python or Path(sys.prefix).parent / ".venv-export" / "bin" / "python"


def can_export(model: ModelRef, settings) -> bool:
    """The IR is there already, or an exporter is installed to make it."""
    return (exported_dir(model, settings) / "openvino_model.xml").exists() or exporter_python(settings).exists()


def ensure_exported(model: ModelRef, settings) -> Path:
    """The model's IR at `settings.weights`, exported on first use (once per host: a file lock)."""
    python = exporter_python(settings)
    target = exported_dir(model, settings)
    if not can_export(model, settings):
        raise OpenVINOUnavailable(f"{model.name} needs an export to OpenVINO IR and there is no exporter "
                                  f"at {python} (bash -c 'source ops/common.sh; install_openvino_exporter')")
    return build_once(target, "openvino_model.xml", lambda tmp: _export(python, model, settings.weights, tmp))


def _export(python: Path, model: ModelRef, weights: str, out: Path) -> None:
    log.info("exporting %s to OpenVINO IR with %s weights, once, into %s (a minute or more)",
             model.name, weights, out.parent)
    command = [str(python.parent / "optimum-cli"), "export", "openvino",
               "-m", str(model.path), "--task", "text-generation-with-past", *EXPORT_FORMATS[weights], str(out)]
    done = run_exporter(command)
    if done.returncode != 0 or not (out / "openvino_model.xml").exists():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise OpenVINOUnavailable(f"exporting {model.name} to OpenVINO IR failed:\n{tail}")


def run_exporter(command: list[str]) -> subprocess.CompletedProcess:
    """Run a program of the exporter's environment, its output captured. Its OpenVINO converter
    and NNCF send usage data and keep a client id unless the user declined: llmq declines for
    the user who has not chosen (and the environment, `common.no_telemetry.OFF`, is inherited)."""
    decline_openvino_telemetry()
    return subprocess.run(command, capture_output=True, text=True)


if __name__ == "__main__":  # `python -m worker.engine.openvino_model [WEIGHTS ...]`: export ahead of time
    # What a worker's first start would do (a minute or more per format), done once before a run
    # whose workers must be ready within a deadline (the test suite's stacks).
    from common.logs import setup_logging
    from common.models import resolve_model
    from common.settings import get_settings

    setup_logging(get_settings(), "prepare")
    model = resolve_model(get_settings(), prepare=True)
    for weights in sys.argv[1:] or [DEFAULT_WEIGHTS]:
        settings = get_settings().model_copy(update={"weights": weights})
        if can_export(model, settings):
            print(ensure_exported(model, settings))
