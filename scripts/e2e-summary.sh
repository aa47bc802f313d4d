#!/usr/bin/env bash
# e2e-summary.sh passes `go test -v` output through and ends with a count of
# passed/failed/skipped subtests per IP mode (ipv4, ipv6, dual), then the
# names of the tests that failed.
set -uo pipefail
declare -A pass fail skip said
failed=()
slow=() # "seconds name" of each test and subtest, for the slowest list

cur=""
# A test's lines that read like a failure (go test -v cannot tell t.Errorf
# from t.Logf), kept per test so that the tail names why it failed.
why='(want|did not|never|mismatch|timed out|deadline|unexpected|panic|fail|error|no [a-z]+ (row|answer|finding))'
for m in ipv4 ipv6 dual; do pass[$m]=0; fail[$m]=0; skip[$m]=0; done
while IFS= read -r line; do
  printf '%s\n' "$line"
  if [[ $line =~ ^===\ (RUN|CONT|NAME)\ +([^ ]+) ]]; then
    cur=${BASH_REMATCH[2]}
  elif [[ -n $cur && $line =~ _test\.go:[0-9]+: && ${line,,} =~ $why ]]; then
    said[$cur]+="${line:0:400}"$'\n'
  fi
  if [[ $line =~ ---\ (PASS|FAIL|SKIP):\ ([^ ]+) ]]; then
    res=${BASH_REMATCH[1]}; name=${BASH_REMATCH[2]}
    if [[ $line =~ \(([0-9.]+)s\) ]]; then
      slow+=("${BASH_REMATCH[1]} $name")
    fi
    [[ $res == FAIL ]] && failed+=("$name")
    for m in ipv4 ipv6 dual; do
      if [[ /$name/ == */$m/* ]]; then
        case $res in PASS) ((pass[$m]++));; FAIL) ((fail[$m]++));; SKIP) ((skip[$m]++));; esac
      fi
    done
  fi
done
echo
echo "e2e results per IP mode:"
for m in ipv4 ipv6 dual; do
  printf '  %-5s %d passed, %d failed, %d skipped\n' "$m" "${pass[$m]}" "${fail[$m]}" "${skip[$m]}"
done
# The slowest tests and subtests, to see where the tier's time goes (a
# test whose subtests are parallel reports only its own body's time, so
# the subtests are listed too; parallel ones overlap).
if ((${#slow[@]})); then
  echo "slowest tests and subtests (seconds; parallel ones overlap):"
  printf '%s\n' "${slow[@]}" | sort -rn | head -n 15 | awk '{printf "  %7.1f  %s\n", $1, $2}'
fi
# The failed tests' names close the output, so that a log's tail (all that CI
# may show) says what to rerun.
if ((${#failed[@]})); then
  echo "failed tests:"
  printf '  %s\n' "${failed[@]}"
  echo "why (the failed tests' last lines that read like a failure):"
  for name in "${failed[@]}"; do
    [[ -n ${said[$name]:-} ]] || continue
    printf '%s' "${said[$name]}" | tail -n 4 | sed "s|^ *|  $name: |"
  done
fi
