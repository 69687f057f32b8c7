"""Nothing phones home: every library llmq runs keeps its usage reporting off.

Several of them report by default: vLLM sends usage stats to stats.vllm.ai, huggingface_hub
(and through it transformers and optimum) tags its requests with usage data, Ray (in vLLM's GPU
image) reports cluster usage, and OpenVINO's tools (the exporter's model converter and NNCF)
send usage counts to Google Analytics and keep a client id in `~/intel/`. This module is the
one list of switches:

- `OFF`, the environment variables those libraries honour. `apply()` sets them in this process
  (importing `common` does it, before any of those libraries is imported, since some read them
  once at import) and so in every process it starts (the exporter, vLLM's engine cores).
  ops/common.sh exports them for the scripts (`shell_exports()`); the Dockerfile,
  docker-compose.yml and deploy/kubernetes/config.yaml carry the same list (tests/ops checks it).
- `decline_openvino_telemetry()`: OpenVINO's tools read no variable, only a consent file.

A value set explicitly in the environment, or a consent file already there, is the user's
choice and is left as it is: this is llmq's default, not a lock.
"""
from __future__ import annotations

import logging
import os
import shlex
from collections.abc import MutableMapping
from pathlib import Path

log = logging.getLogger(__name__)

OFF = {
    "VLLM_NO_USAGE_STATS": "1",  # vllm/usage/usage_lib.py: is_usage_stats_enabled()
    "VLLM_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",  # the shared convention (https://donottrack.sh): vLLM, huggingface_hub
    "HF_HUB_DISABLE_TELEMETRY": "1",  # huggingface_hub's usage data, for transformers and optimum too
    "RAY_USAGE_STATS_ENABLED": "0",  # Ray, which vLLM's GPU image ships
}

# What OpenVINO's `opt_in_out --opt_out` writes; the tools read it from $HOME (openvino_telemetry).
OPENVINO_CONSENT = Path("intel") / "openvino_telemetry"


def apply(environ: MutableMapping[str, str] = os.environ) -> None:
    """Turn every library's usage reporting off in `environ` unless it was set there already."""
    for name, value in OFF.items():
        environ.setdefault(name, value)


def decline_openvino_telemetry(home: Path | None = None) -> bool:
    """Decline OpenVINO's telemetry in `home` (default: this user's) before its tools run.

    Without a consent file, OpenVINO's converter and NNCF count as consented: they write a client
    id and usage counts under `~/intel/` and send events. This writes the "0" that
    `opt_in_out --opt_out` writes, without the opt-out event that script itself sends. False (and
    a warning) when it cannot be written."""
    consent = (home or Path.home()) / OPENVINO_CONSENT
    if consent.exists():
        return True
    try:
        consent.parent.mkdir(exist_ok=True)
        consent.write_text("0")
    except OSError as exc:
        log.warning("could not write %s (%s): OpenVINO's tools may report usage; run "
                    "`opt_in_out --opt_out` from the exporter's environment", consent, exc)
        return False
    return True


def shell_exports() -> str:
    """For ops/common.sh (`eval "$(python3 -c 'import common.no_telemetry as t; print(t.shell_exports())')"`):
    OpenVINO's telemetry declined, and the `export` lines of `OFF`."""
    logging.basicConfig(format="[llmq] %(message)s")
    decline_openvino_telemetry()
    return "\n".join(f"export {name}={shlex.quote(os.environ.get(name, value))}" for name, value in OFF.items())
