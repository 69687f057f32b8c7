#!/usr/bin/env bash
# Start, list or stop a machine's pinned workers.
#   bash ops/workers.sh start [--cpu K] [--gpu G|all]   K CPU workers, G GPU (vLLM) workers
#   bash ops/workers.sh status | stop
#
# The CPUs this shell may use are split into K+G disjoint sets (python -m worker.pinning): each CPU
# worker gets its own set (sched_setaffinity, torch threads = its size) and each GPU worker one set
# plus one GPU (CUDA_VISIBLE_DEVICES). Every worker consumes its model's queue, so the API's jobs
# go to whichever worker of that model is free. CPU_MODEL / GPU_MODEL pick a model per device
# (default: LLMQ_MODEL). With LLMQ_METRICS_PORT=P, worker i serves metrics on port P+i.
# Several machines running this against one Redis (LLMQ_REDIS_URL) is the scale-out path.
source "$(dirname "$0")/common.sh"

cmd=${1:-status}; shift || true
cpu=0; gpu=0
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) cpu=$2; shift 2 ;;
    --gpu) gpu=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
prefix=${LLMQ_NAMESPACE:-llmq}
metrics_base=${LLMQ_METRICS_PORT:-0}

pidfiles() { ls "$RUN_DIR"/worker-*.pid 2>/dev/null || true; }

start() {
  [ "$gpu" = all ] && gpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  local total=$((cpu + gpu)) i=0 sets
  [ "$total" -gt 0 ] || { echo "nothing to start: give --cpu K and/or --gpu G" >&2; exit 2; }
  mapfile -t sets < <("$PY" -m worker.pinning "$total")
  [ "${#sets[@]}" -eq "$total" ] || { echo "cannot pin $total workers on these CPUs" >&2; exit 1; }
  for ((n = 0; n < cpu; n++, i++)); do
    start_worker "cpu$n" "${sets[$i]}" "$i" LLMQ_ENGINE=hf ${CPU_MODEL:+LLMQ_MODEL=$CPU_MODEL}
  done
  for ((n = 0; n < gpu; n++, i++)); do
    start_worker "gpu$n" "${sets[$i]}" "$i" LLMQ_ENGINE=vllm CUDA_VISIBLE_DEVICES="$n" \
      ${GPU_MODEL:+LLMQ_MODEL=$GPU_MODEL}
  done
}

start_worker() {  # start_worker NAME CPUS INDEX VAR=VALUE...
  local name=$1 cpus=$2 index=$3 port=0; shift 3
  [ "$metrics_base" -gt 0 ] && port=$((metrics_base + index))
  start_bg "worker-$name" env "$@" "$PY" -m worker --cpus "$cpus" --metrics-port "$port" \
    --name "$prefix-$name@%h"
  log "worker-$name: cpus $cpus, metrics port $port"
}

status() {
  for pidfile in $(pidfiles); do
    pid=$(cat "$pidfile"); name=$(basename "$pidfile" .pid)
    if kill -0 "$pid" 2>/dev/null; then
      echo "$name pid $pid cpus $(awk '/^Cpus_allowed_list/ {print $2}' "/proc/$pid/status")"
    else
      echo "$name (pid $pid) not running"
    fi
  done
}

stop() {
  for pidfile in $(pidfiles); do
    pid=$(cat "$pidfile")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      log "stopped $(basename "$pidfile" .pid)"
    fi
    rm -f "$pidfile"
  done
}

case $cmd in
  start) start ;;
  status) status ;;
  stop) stop ;;
  *) echo "usage: $0 start [--cpu K] [--gpu G|all] | status | stop" >&2; exit 2 ;;
esac
