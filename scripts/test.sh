#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, then run it.
#   - Debian's redis-server and postgresql (the tests start their own instances),
#     chromium (the HTML report is checked in a real headless browser), and nodejs with
#     npm (the official Node openai SDK drives the proxy; installed into ~/.cache/kvmigrate)
#   - the project with its test extras, in .venv
#   - a CPU build of vLLM in a cached venv (~/.cache/kvmigrate), for the real-engine tests
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v chromium >/dev/null \
    || ! command -v node >/dev/null || ! command -v npm >/dev/null \
    || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server postgresql chromium nodejs npm >/dev/null
fi

python3 -m venv .venv
.venv/bin/pip install -q -e '.[test]'
.venv/bin/python -m kvmigrate.testbed install
# Here a missing redis-server, PostgreSQL or Chromium fails the run, never skips (tests/services.py).
export KVMIGRATE_TEST_REQUIRE_SERVICES=1
# One xdist worker per core (at least 2): each file runs whole on one worker, and the files
# sharing the session's vLLM on one (tests/conftest.py). More workers than cores left the
# recorder's idle-priority workers no CPU at all in the crash tests, which wait for them.
# KVMIGRATE_TEST_WORKERS=0, or `-p no:xdist` among the arguments, runs it in one process.
cores=$(.venv/bin/python -c 'import os; print(max(2, len(os.sched_getaffinity(0))))')
workers=(-n "${KVMIGRATE_TEST_WORKERS:-$cores}" --dist loadgroup --no-loadscope-reorder)
for arg in "$@"; do [[ $arg == *no:xdist ]] && workers=(); done
exec .venv/bin/pytest "${workers[@]}" --durations=30 "$@"
