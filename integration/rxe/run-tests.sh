#!/usr/bin/env bash
# Runs inside the rxe VM (started by integration/run-rxe): runs the test
# executables listed in LIST, one after the other, each in its package's
# directory like `cargo test` does, with --test-threads=1 and TEST-ARGS.
# Prints a result line per executable and a summary; exits 1 if any failed.
#
# Usage: run-tests.sh LIST [TEST-ARGS...]
#   LIST: lines "executable<TAB>package directory<TAB>label<TAB>reason
#   <TAB>filter", "-" for an empty field; a reason says why the executable
#   runs on the host only; a filter is the name filter it runs with when
#   TEST-ARGS hold none (an argument not starting with "-").
set -uo pipefail
{ # one compound command: editing this file cannot break a run in progress

LIST=$1
shift
threads=(--test-threads=1)
own_filter=
for a in "$@"; do
  case "$a" in
    --test-threads|--test-threads=*) threads=() ;;
    -*) ;;
    *) own_filter=1 ;;
  esac
done
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
log=$(mktemp)

now() { date +%s%N; }
secs() { printf '%d.%01d' $(($1 / 1000000000)) $(($1 / 100000000 % 10)); }
total=$(grep -c . "$LIST")
n=0 bad=0 passed=0 failed=0 ignored=0 skipped=0
results=()
t0=$(now)
# Executables that run in the host's test command only, with the reason:
# lines "label<TAB>reason" (integration/rxe/host-only).
host_only=$(dirname "${BASH_SOURCE[0]}")/host-only
while IFS=$'\t' read -r -u 3 exe dir label reason filter; do
  [ -n "$exe" ] || continue
  n=$((n + 1))
  [ "$reason" = - ] && reason=
  [ "$filter" = - ] && filter=
  [ -n "$reason" ] || reason=$(awk -F'\t' -v l="$label" '$1 == l { print $2 }' "$host_only" 2>/dev/null)
  if [ -n "$reason" ]; then
    skipped=$((skipped + 1))
    line="skipped       $label (host only: $reason)"
    results+=("$line")
    echo "=== [$n/$total] $line"
    continue
  fi
  args=("$@")
  [ -n "$filter" ] && [ -z "$own_filter" ] && args+=("$filter")
  echo "=== [$n/$total] $label${args[*]:+ (${args[*]})}"
  t=$(now)
  (cd "$dir" && CARGO_MANIFEST_DIR=$dir exec "$exe" "${threads[@]}" "${args[@]}") </dev/null | tee "$log"
  rc=${PIPESTATUS[0]}
  dt=$(secs $(($(now) - t)))
  # libtest: "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; ..."
  p='' f='' i=''
  read -r p f i < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' "$log" | tail -n1)
  passed=$((passed + ${p:-0})) failed=$((failed + ${f:-0})) ignored=$((ignored + ${i:-0}))
  if [ "$rc" = 0 ]; then
    line="ok      ${dt}s  $label (${p:-?} passed, ${i:-0} ignored)"
  else
    bad=$((bad + 1))
    line="FAILED  ${dt}s  $label (exit status $rc, ${f:-?} failed)"
  fi
  results+=("$line")
  echo "=== $line"
done 3< "$LIST"
rm -f "$log"

echo
echo "=== rxe test summary ($(secs $(($(now) - t0)))s in the VM)"
for line in "${results[@]+"${results[@]}"}"; do echo "  $line"; done
echo "=== $n executables: $((n - bad - skipped)) ok, $bad failed, $skipped skipped (host only); tests: $passed passed, $failed failed, $ignored ignored"
[ "$bad" = 0 ] && exit 0
exit 1
}
