#!/usr/bin/env bash
# Stop what ops/run.sh (and ops/workers.sh) started, and nothing else: the processes named by the pid
# files these scripts wrote in $RUN_DIR. Redis is stopped only when these scripts started it
# (redis.pid); a Redis that was already running is left alone.
#   bash ops/stop.sh [--keep-redis]      (--keep-redis: services only; ops/run.sh uses it on restart)
source "$(dirname "$0")/common.sh"

started_by_us() {  # started_by_us PIDFILE PID: the process began before its pid file was written,
  # so it is the one we started and not a later process that was given the same (reused) pid
  [ -r "/proc/$2/stat" ] || return 1
  local btime ticks started
  btime=$(awk '/^btime/ {print $2}' /proc/stat)
  ticks=$(sed 's/.*) //' "/proc/$2/stat" | awk '{print $20}')
  started=$((btime + ticks / $(getconf CLK_TCK)))
  [ "$started" -le $(($(stat -c %Y "$1") + 1)) ]
}

stop_pidfile() {  # TERM, up to 10 s to finish (a worker hands its jobs back), then KILL
  local pidfile=$1 pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if started_by_us "$pidfile" "$pid" && kill "$pid" 2>/dev/null; then
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped $(basename "$pidfile" .pid)"
  fi
  rm -f "$pidfile"
}

for pidfile in "$RUN_DIR"/*.pid; do  # services first: api, flower, worker, worker-* (ops/workers.sh), ...
  case $(basename "$pidfile") in redis*.pid|sentinel*.pid) continue ;; esac
  stop_pidfile "$pidfile"
done
if [ "${1:-}" != --keep-redis ]; then
  for pidfile in "$RUN_DIR"/sentinel*.pid "$RUN_DIR"/redis*.pid; do stop_pidfile "$pidfile"; done
fi
