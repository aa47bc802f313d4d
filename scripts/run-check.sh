#!/usr/bin/env bash
# run-check.sh: the first step of `make run`, before deps and build: says at
# once, rather than minutes later, when the demo it would start cannot
# start because one already runs with the same lab state directory, lab
# namespace prefix or data directory, or because one of its TCP ports is
# taken. The demo checks the same locks when it starts (lab/labcmd:
# lockDemo, lockPrefix; collector/store/chdb: DirHolder); this is the early
# answer, with the make variables that start a second demo beside the first.
#
# Environment (the make variables of `make run`): STATE_DIR, PREFIX,
# DATA_DIR, WEB_ADDR, CLICKHOUSE_HTTP_ADDR, METRICS_ADDR, IPFIX_ADDR (empty:
# the demo's loopback 4739).
set -euo pipefail

log() { printf '[run] %s\n' "$*" >&2; }

problems=()

# held FILE: another process holds the flock of FILE (what lockDemo and the
# engine take). A missing file is not held; nothing is created.
held() {
  [ -e "$1" ] || return 1
  command -v flock >/dev/null || return 1
  ! flock -n "$1" true 2>/dev/null
}

# listening HOST:PORT: something accepts TCP connections there (":PORT"
# and "0.0.0.0"/"[::]" are checked on loopback).
listening() {
  local addr=$1 host port
  port=${addr##*:}
  host=${addr%:*}
  host=${host#[}
  host=${host%]}
  case $host in "" | 0.0.0.0) host=127.0.0.1 ;; ::) host=::1 ;; esac
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null
}

state_lock=$STATE_DIR/demo.lock
if held "$state_lock"; then
  pid=$(tr -d '[:space:]' <"$state_lock" 2>/dev/null || true)
  url=$(cat "$STATE_DIR/web-url" 2>/dev/null || true)
  problems+=("a demo runs on the lab of STATE_DIR=$STATE_DIR (pid ${pid:-unknown}${url:+, web UI $url})")
fi
prefix_lock=${TMPDIR:-/tmp}/dualflow-lab-prefix-${PREFIX//\//_}/demo.lock
if held "$prefix_lock"; then
  problems+=("a demo runs on the lab namespaces PREFIX=$PREFIX (pid $(tr -d '[:space:]' <"$prefix_lock" 2>/dev/null || echo unknown))")
fi
if held "$DATA_DIR/status"; then
  problems+=("DATA_DIR=$DATA_DIR is in use ($(head -c 200 "$DATA_DIR/status" 2>/dev/null | tr -s '[:space:]' ' '))")
fi
for v in WEB_ADDR CLICKHOUSE_HTTP_ADDR METRICS_ADDR IPFIX_ADDR; do
  addr=${!v}
  if [ "$v" = IPFIX_ADDR ] && [ -z "$addr" ]; then addr=127.0.0.1:4739; fi
  if [ -n "$addr" ] && listening "$addr"; then
    problems+=("$v=$addr: something listens there")
  fi
done

if [ ${#problems[@]} -eq 0 ]; then exit 0; fi
log "not starting the demo:"
for p in "${problems[@]}"; do log "  $p"; done
log "stop the running demo first (Ctrl-C in its terminal), or start a second one beside it, e.g."
log "  make run STATE_DIR=/run/dualflow/lab2 PREFIX=df2- DATA_DIR=var/data2 WEB_ADDR=127.0.0.1:8081 \\"
log "    CLICKHOUSE_HTTP_ADDR=127.0.0.1:8124 METRICS_ADDR=127.0.0.1:9465 IPFIX_ADDR=127.0.0.1:4839"
exit 1
