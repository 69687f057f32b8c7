#!/usr/bin/env bash
# Stop what ops/run.sh started (Redis is left alone).
source "$(dirname "$0")/common.sh"
for pidfile in "$RUN_DIR"/{api,flower,worker,batch_worker}.pid "$RUN_DIR"/worker-*.pid; do  # worker-*: ops/workers.sh
  [ -f "$pidfile" ] || continue
  name=$(basename "$pidfile" .pid)
  pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped $name"
  fi
  rm -f "$pidfile"
done
