#!/usr/bin/env bash
# fuzz.sh runs every Go fuzz target of the module for the given time
# (default 20s each), then prints each target's exec count. New crashers
# land in the package's testdata/fuzz/; a failing target does not stop the
# others, and the script exits 1 at the end.
#
# A duration -fuzztime can fail a target with a bare "context deadline
# exceeded" at the deadline, under load, without a crasher: a race in Go's
# fuzzing coordinator (go.dev/issue/75804, fixed in Go 1.27). Such a run is
# reported as "ok (go#75804)"; one that wrote a crasher still fails.
#
# FUZZ_MINIMIZE_TIME (default 100x: a hundred runs) bounds the minimization
# of each input that finds new coverage or fails, during which fuzzing
# stops. A time bound is spent whole on inputs that do not shrink: at Go's
# default of 60 s the IPFIX decoder ran 33 execs in 3 minutes, at 5 s 159
# in 30 s, at 100x about 120,000.
set -uo pipefail
cd "$(dirname "$0")/.."
t=${1:-20s}
minimize=${FUZZ_MINIMIZE_TIME:-100x}
mod=$(go list -m)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# Every package of the module with a fuzz target in its test files
# (in-package and external), found in the sources rather than with
# `go test -list`, which would skip a package whose tests do not build.
targets=()
while read -r dir pkg files; do
  for f in $files; do
    grep -oE '^func Fuzz[A-Za-z0-9_]*\(' "$dir/$f" | sed -e 's/^func //' -e 's/($//' |
      while read -r name; do echo "$pkg $dir $name"; done
  done
done < <(go list -f '{{.Dir}} {{.ImportPath}} {{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}' ./...) > "$logs/targets"
mapfile -t targets < "$logs/targets"
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz.sh: no fuzz target found" >&2
  exit 1
fi

# seconds converts a Go duration as the fuzzer prints it (1h2m3s) to seconds.
seconds() {
  local d=$1 s=0
  if [[ $d =~ ([0-9]+)h ]]; then s=$((s + BASH_REMATCH[1] * 3600)); fi
  if [[ $d =~ ([0-9]+)m ]]; then s=$((s + BASH_REMATCH[1] * 60)); fi
  if [[ $d =~ ([0-9]+)s ]]; then s=$((s + BASH_REMATCH[1])); fi
  echo "$s"
}

failed=0
summary=()
for i in "${!targets[@]}"; do
  read -r pkg dir f <<<"${targets[$i]}"
  echo "== [$((i + 1))/${#targets[@]}] $pkg $f ($t, minimize $minimize)"
  out="$logs/$i.log"
  crashers=$(ls "$dir/testdata/fuzz/$f" 2>/dev/null | wc -l)
  if go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" -fuzzminimizetime "$minimize" "$pkg" 2>&1 | tee "$out"; then
    result=ok
  elif grep -q '^    context deadline exceeded$' "$out" && ! grep -q 'Failing input written' "$out" &&
    [ "$(ls "$dir/testdata/fuzz/$f" 2>/dev/null | wc -l)" -eq "$crashers" ]; then
    result="ok (go#75804)"
  else
    result=FAIL
    failed=1
  fi
  # The last progress line: "fuzz: elapsed: 1m0s, execs: 123456 (0/sec), ...";
  # none when the baseline coverage (the seed corpus) took all the time.
  last=$(grep -E 'fuzz: elapsed: [0-9hms]+, execs: [0-9]+' "$out" | tail -n 1)
  execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
  elapsed=$(seconds "$(sed -nE 's/fuzz: elapsed: ([0-9hms]+),.*/\1/p' <<<"$last")")
  note=""
  if [ -z "$execs" ]; then
    execs=0 elapsed=0 note=" (baseline coverage not done)"
  fi
  summary+=("$(printf '%-56s %10s %9s  %s' "${pkg#"$mod"/} $f" "$execs" "$((execs / (elapsed > 0 ? elapsed : 1)))" "$result$note")")
done

echo
echo "== fuzz summary: ${#targets[@]} targets, $t each, minimize $minimize"
printf '%-56s %10s %9s  %s\n' target execs execs/s result
printf '%s\n' "${summary[@]}"
exit $failed
