#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, then run it.
#   - Debian's redis-server and postgresql (the tests start their own instances), and
#     chromium (the HTML report is checked in a real headless browser)
#   - the project with its test extras, in .venv
#   - a CPU build of vLLM in a cached venv (~/.cache/kvmigrate), for the real-engine tests
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v chromium >/dev/null \
    || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server postgresql chromium >/dev/null
fi

python3 -m venv .venv
.venv/bin/pip install -q -e '.[test]'
.venv/bin/python -m kvmigrate.testbed install
exec .venv/bin/pytest "$@"
