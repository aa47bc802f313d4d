#!/usr/bin/env bash
# build.sh OUT LDFLAGS: builds ./cmd/dualflow into OUT (make build). The
# first build compiles every dependency, minutes on 2 cores: every 10 s it
# says for how long, how many packages it has compiled and the last one
# (go build -v lists them); at the end, how many and how long. What else
# go build prints (errors, warnings) goes through as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PROGRESS_TAG=build
# shellcheck source=scripts/progress.sh
. scripts/progress.sh

out=$1 ldflags=$2
GO=${GO:-go}
list=$(mktemp)
# Only this shell removes it: a background job of with_progress runs the
# EXIT trap too when it is a subshell.
trap '[ "$BASHPID" = "$$" ] && rm -f "$list"' EXIT

# A line of go build -v that is a package path (not an error or warning).
pkgline='^[A-Za-z0-9._~/-]+$'
progress_note() {
  local n last
  n=$(grep -cE "$pkgline" "$list" || true)
  last=$(grep -E "$pkgline" "$list" | tail -n 1 || true)
  printf ', %d packages compiled%s' "$n" "${last:+, last $last}"
}

log "compiling $out from ./cmd/dualflow (the first build compiles every dependency: a few minutes)"
start=$SECONDS rc=0
# Only go build's stderr goes to the list: the progress lines must reach
# the terminal while it runs.
gobuild() { "$GO" build -v -ldflags "$ldflags" -o "$out" ./cmd/dualflow 2>"$list"; }
with_progress "compiling $out" "" gobuild || rc=$?
grep -vE "$pkgline" "$list" >&2 || true
if [ "$rc" != 0 ]; then
  log "compiling $out failed after $((SECONDS - start)) s"
  exit "$rc"
fi
n=$(grep -cE "$pkgline" "$list" || true)
if [ "$n" = 0 ]; then
  log "$out is up to date"
else
  log "$out built: $n packages compiled in $((SECONDS - start)) s"
fi
