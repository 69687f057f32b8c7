#!/usr/bin/env bash
# The test command: install what the tests need, start Redis if none answers, prepare the model,
# run the suite against real Redis, real Celery workers and the real embedded model.
#   bash ops/test.sh [pytest args]      (e.g. -m "not slow" for the quick layer)
source "$(dirname "$0")/common.sh"
export HF_HUB_OFFLINE=1
install_deps
ensure_chromium
ensure_redis
LLMQ_MODEL=${LLMQ_TEST_MODEL:-embedded} prepare_model >/dev/null
exec "$PY" -m pytest -q -ra "$@"
