#!/usr/bin/env bash
# Start, list or stop a machine's pinned workers.
#   bash ops/workers.sh start [--cpu K] [--gpu G|all] [--gpu-groups "0,1,2,3 4,5,6,7"]
#   bash ops/workers.sh status | stop
#
# The CPUs this shell may use are split into one disjoint set per worker (python -m worker.pinning):
# each CPU worker gets its own set (sched_setaffinity; its engine's threads = its size) and each GPU
# worker one set plus its GPUs (CUDA_VISIBLE_DEVICES). A GPU worker owns a group of
# LLMQ_VLLM_TENSOR_PARALLEL_SIZE x LLMQ_VLLM_PIPELINE_PARALLEL_SIZE GPUs (1 by default): --gpu G
# takes the first G GPUs in consecutive groups of that size, --gpu-groups names the groups
# (space between groups, commas inside one; a group's size sets its tensor parallel size where
# the environment does not). CPU workers run LLMQ_ENGINE (default auto: the fastest CPU engine)
# and see no GPU. Every worker consumes its model's queue, so the API's jobs go to whichever
# worker of that model is free. CPU_MODEL / GPU_MODEL pick a model per device (default:
# LLMQ_MODEL). With LLMQ_METRICS_PORT=P, worker i serves metrics on port P+i. Several machines
# running this against one Redis (LLMQ_REDIS_URL) is the scale-out path.
source "$(dirname "$0")/common.sh"

cmd=${1:-status}; shift || true
cpu=0; gpu=0; groups=""
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) cpu=$2; shift 2 ;;
    --gpu) gpu=$2; shift 2 ;;
    --gpu-groups) groups=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
prefix=${LLMQ_NAMESPACE:-llmq}
metrics_base=${LLMQ_METRICS_PORT:-0}

pidfiles() { ls "$RUN_DIR"/worker-*.pid 2>/dev/null || true; }

gpu_worker_groups() {  # one GPU group a line: --gpu-groups as given, or --gpu G in groups of TP x PP
  if [ -n "$groups" ]; then
    tr ' ' '\n' <<<"$groups" | grep .
  elif [ "$gpu" != 0 ]; then
    local ids
    if [ "$gpu" = all ]; then ids=$(nvidia-smi --query-gpu=index --format=csv,noheader)
    else ids=$(seq 0 $((gpu - 1))); fi
    "$PY" -m worker.pinning --gpu-groups \
      $(( ${LLMQ_VLLM_TENSOR_PARALLEL_SIZE:-1} * ${LLMQ_VLLM_PIPELINE_PARALLEL_SIZE:-1} )) $ids
  fi
}

start() {
  local gpu_sets i=0 sets n group size
  mapfile -t gpu_sets < <(gpu_worker_groups)
  if [ "$gpu" != 0 ] || [ -n "$groups" ]; then
    [ "${#gpu_sets[@]}" -gt 0 ] || { echo "no GPU worker to start (see the message above)" >&2; exit 1; }
  fi
  local total=$((cpu + ${#gpu_sets[@]}))
  [ "$total" -gt 0 ] || { echo "nothing to start: give --cpu K, --gpu G or --gpu-groups" >&2; exit 2; }
  mapfile -t sets < <("$PY" -m worker.pinning "$total")
  [ "${#sets[@]}" -eq "$total" ] || { echo "cannot pin $total workers on these CPUs" >&2; exit 1; }
  for ((n = 0; n < cpu; n++, i++)); do
    start_worker "cpu$n" "${sets[$i]}" "$i" LLMQ_ENGINE="${LLMQ_ENGINE:-auto}" CUDA_VISIBLE_DEVICES= \
      ${CPU_MODEL:+LLMQ_MODEL=$CPU_MODEL}
  done
  for ((n = 0; n < ${#gpu_sets[@]}; n++, i++)); do
    group=${gpu_sets[$n]}; size=$(tr ',' '\n' <<<"$group" | grep -c .)
    start_worker "gpu$n" "${sets[$i]}" "$i" LLMQ_ENGINE=vllm CUDA_VISIBLE_DEVICES="$group" \
      LLMQ_VLLM_TENSOR_PARALLEL_SIZE="${LLMQ_VLLM_TENSOR_PARALLEL_SIZE:-$((size / ${LLMQ_VLLM_PIPELINE_PARALLEL_SIZE:-1}))}" \
      ${GPU_MODEL:+LLMQ_MODEL=$GPU_MODEL}
  done
}

start_worker() {  # start_worker NAME CPUS INDEX VAR=VALUE...
  local name=$1 cpus=$2 index=$3 port=0; shift 3
  [ "$metrics_base" -gt 0 ] && port=$((metrics_base + index))
  start_bg "worker-$name" env "$@" "$PY" -m worker --cpus "$cpus" --metrics-port "$port" \
    --name "$prefix-$name@%h"
  log "worker-$name: cpus $cpus, metrics port $port $(printf '%s\n' "$@" | grep -E '^(CUDA_VISIBLE_DEVICES|LLMQ_VLLM_TENSOR)=.' | tr '\n' ' ')"
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
  *) echo "usage: $0 start [--cpu K] [--gpu G|all] [--gpu-groups 'G,G G,G'] | status | stop" >&2; exit 2 ;;
esac
