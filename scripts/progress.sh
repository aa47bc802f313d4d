# progress.sh: progress lines of the long steps of scripts/deps.sh and
# scripts/build.sh, so that a first run that downloads or compiles for
# minutes does not look hung. Sourced; the caller sets PROGRESS_TAG.

log() { printf '[%s] %s\n' "${PROGRESS_TAG:-dualflow}" "$*" >&2; }

# with_progress WHAT DIR CMD...: runs CMD and, while it runs, says every
# 10 s for how long, how many MB DIR holds (when DIR is not empty), and
# what the function progress_note prints (when the caller defines one);
# at the end, when it took 10 s or more, how long it took.
with_progress() {
  local what=$1 dir=$2 start=$SECONDS rc=0
  shift 2
  "$@" &
  local pid=$!
  (
    while sleep 10 >/dev/null 2>&1; do
      kill -0 "$pid" 2>/dev/null || exit 0
      note=""
      if [ -n "$dir" ] && [ -d "$dir" ]; then note=", $(du -sm "$dir" 2>/dev/null | cut -f1) MB in $dir"; fi
      if declare -F progress_note >/dev/null; then note="$note$(progress_note)"; fi
      log "$what: $((SECONDS - start)) s so far$note"
    done
  ) &
  local ticker=$!
  wait "$pid" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  [ "$rc" = 0 ] && [ $((SECONDS - start)) -ge 10 ] && log "$what: done in $((SECONDS - start)) s"
  return "$rc"
}
