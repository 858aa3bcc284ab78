#!/usr/bin/env bash
# Is the suite free of wall-clock flakiness? Two checks, independent of CI:
#
#   1. the whole suite RUNS times in a row (3 by default) while a CPU hog runs beside it:
#      `stress-ng --cpu N` when installed (apt-get install stress-ng), else one busy loop per
#      core; N is the number of cores (HOG_CPUS overrides);
#   2. each test file on its own (`pytest tests/x.py`), with no hog, so no test depends on
#      another file having warmed something up first.
#
#   scripts/flaky_check.sh                      both checks, every test file
#   scripts/flaky_check.sh --files-only [F...]  check 2 only; F: test files (default: all)
#   scripts/flaky_check.sh --suite-only         check 1 only
#
# The hog runs in a session of its own (setsid), as stress-ng started in another terminal, or
# any other program on the machine, would: Linux then shares the CPU between the two sessions
# (autogroup; under systemd, cgroups do the same). In the suite's own session the busy loops
# would take every cycle from the recorder's and detector's workers, which run at SCHED_IDLE
# by design (recording never competes with answers; docs/time-in-tests.md), and a test that
# waits for a record would wait for ever.
#
# The claim is the full suite, so no marker is deselected by default; MARKERS narrows it
# (MARKERS="not vllm and not litellm" passes -m "$MARKERS" to every pytest run).
# Prints one line per run and per file, then a summary; exits non-zero when any failed.
# Logs: $FLAKY_DIR (default /tmp/kvmigrate-flaky-<pid>).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
RUNS=${RUNS:-3}
logs=${FLAKY_DIR:-${TMPDIR:-/tmp}/kvmigrate-flaky-$$}
mkdir -p "$logs"
suite=1 files=1
case "${1:-}" in
  --files-only) suite=0; shift ;;
  --suite-only) files=0; shift ;;
esac
pytest=("$PYTHON" -m pytest -q -p no:cacheprovider)
[ -z "${MARKERS:-}" ] || pytest+=(-m "$MARKERS")

hog_pids=()
start_hog() {
  local cpus=${HOG_CPUS:-$(nproc)}
  if command -v stress-ng >/dev/null; then
    setsid stress-ng --cpu "$cpus" --quiet &
    hog_pids+=($!)
    echo "hog: stress-ng --cpu $cpus in its own session (pid $!)"
  else
    # One session holding one loop per core, as stress-ng's workers are.
    setsid bash -c 'for _ in $(seq "$1"); do (while :; do :; done) & done; wait' hog "$cpus" &
    hog_pids+=($!)
    echo "hog: $cpus busy loops in their own session (session $!)"
  fi
}
stop_hog() {
  # Only the processes this script started: each hog leads its own session and process group.
  local pid
  for pid in "${hog_pids[@]}"; do kill -- "-$pid" 2>/dev/null; done
  hog_pids=()
}
# A signal ends the script: the running pytest gets SIGINT (so its fixtures stop the servers
# they started) and the EXIT trap stops the hog. A trap that only stopped the hog would let
# the script go on to its next run.
child=""
stop_child() {
  [ -n "$child" ] || return 0
  kill -INT "$child" 2>/dev/null
  # SIGINT stays ignored where the script itself was started with it ignored (a background
  # job of another script): then SIGTERM, after a grace for the teardown.
  local _
  for _ in $(seq 60); do kill -0 "$child" 2>/dev/null || break; sleep 0.5; done
  kill -TERM "$child" 2>/dev/null
  wait "$child" 2>/dev/null
}
trap stop_hog EXIT
trap 'stop_child; exit 130' INT
trap 'stop_child; exit 143' TERM

summary=()
failed=0
run() {  # name, log file, command...
  local name=$1 log=$2 started rc
  shift 2
  started=$(date +%s)
  # In the background and waited for, so that a signal reaches the traps at once; in its own
  # process group (set -m), where SIGINT is not ignored as it is for a script's background job.
  set -m
  "$@" >"$log" 2>&1 &
  set +m
  child=$!
  wait "$child"
  rc=$?
  child=""
  # pytest exits 5 when a file has no test selected (e.g. only vllm tests, deselected).
  local verdict=pass
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then verdict=FAIL; failed=1; fi
  local line
  line=$(printf '%-4s %-60s %4ss  %s' "$verdict" "$name" "$(($(date +%s) - started))" \
    "$(grep -E '^[0-9]+ (passed|failed)|(passed|failed|error|skipped|deselected)' "$log" | tail -1)")
  echo "$line"
  summary+=("$line")
}

if [ "$suite" -eq 1 ]; then
  start_hog
  for i in $(seq "$RUNS"); do
    run "suite run $i/$RUNS beside the hog" "$logs/suite-$i.log" "${pytest[@]}" tests
  done
  stop_hog
fi

if [ "$files" -eq 1 ]; then
  if [ $# -gt 0 ]; then
    targets=("$@")
  else
    mapfile -t targets < <(find tests -name 'test_*.py' | sort)
  fi
  for f in "${targets[@]}"; do
    run "$f alone" "$logs/$(echo "$f" | tr / _).log" "${pytest[@]}" "$f"
  done
fi

echo
echo "flaky check summary (logs in $logs):"
[ ${#summary[@]} -eq 0 ] || printf '  %s\n' "${summary[@]}"
if [ "$failed" -eq 0 ]; then echo "all passed"; else echo "FAILURES: see the logs above"; fi
exit $failed
