#!/usr/bin/env bash
# The README's playbook, top to bottom, on a fresh clone, with emulated backends: what a new
# team runs in its first week. Every step must get past without reading the source.
#
#   bash scripts/playbook.sh                 # clone, install into a new venv, run it all
#   PLAYBOOK_PYTHON=.venv/bin/python bash scripts/playbook.sh
#                                            # run the clone with an interpreter that already
#                                            # has the dependencies (no install, no network)
#   PLAYBOOK_DEMO_ARGS="--time-scale 0.3"    # faster demos (default: exactly the README's)
#   PLAYBOOK_KEEP=1                          # keep the work directory for a look afterwards
#
# It takes a few minutes; the demos are most of it. Exits non-zero at the first step that
# fails, naming it.
set -Eeuo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$(mktemp -d -t kvmigrate-playbook-XXXXXX)"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [[ -n "${PLAYBOOK_KEEP:-}" ]]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
CURRENT="setup"
trap 'echo "playbook FAILED at: $CURRENT" >&2' ERR

step() {
    CURRENT="$1"
    printf '\n=== %s ===\n' "$1"
}
# Run a command that may exit with one of the codes listed (the CLI's documented non-zero
# exits: "changes proposed", "cache busters found", ...); any other code fails the step.
allow() {
    local codes="$1"; shift
    local rc=0
    "$@" || rc=$?
    [[ " $codes " == *" $rc "* ]] || { echo "exit $rc, expected one of: $codes" >&2; return 1; }
}
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {
    for _ in $(seq 1 100); do
        "$PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$1" \
            2>/dev/null && return 0
        sleep 0.2
    done
    echo "nothing answers at $1" >&2
    return 1
}

step "fresh clone"
git clone -q "$SRC" "$WORK/kvmigrate"
git -C "$WORK/kvmigrate" checkout -q "$(git -C "$SRC" rev-parse HEAD)"
# Work in progress travels too: the playbook checks the tree as it is, not the last commit.
(cd "$SRC" && git ls-files -mo --exclude-standard -z) | (cd "$SRC" && xargs -0 -r cp --parents -t "$WORK/kvmigrate" 2>/dev/null || true)
cd "$WORK/kvmigrate"

step "install (README: python3 -m venv .venv && .venv/bin/pip install -q .)"
if [[ -n "${PLAYBOOK_PYTHON:-}" ]]; then
    PY="$PLAYBOOK_PYTHON"
    [[ "$PY" == /* ]] || PY="$SRC/$PY"  # not resolved further: a venv's python is a link
    export PYTHONPATH="$WORK/kvmigrate"
    kvmigrate() { "$PY" -m kvmigrate "$@"; }
else
    python3 -m venv .venv && .venv/bin/pip install -q .
    PY="$WORK/kvmigrate/.venv/bin/python"
    kvmigrate() { "$WORK/kvmigrate/.venv/bin/kvmigrate" "$@"; }
fi
kvmigrate --version

step "demo"
# shellcheck disable=SC2086
kvmigrate demo ${PLAYBOOK_DEMO_ARGS:-} --out "$WORK/demo.html"
step "demo --bad-candidate"
# shellcheck disable=SC2086
kvmigrate demo --bad-candidate ${PLAYBOOK_DEMO_ARGS:-} --out "$WORK/demo-bad.html"

step "emulated backends: a hosted API and a vLLM"
HOSTED_PORT="$(free_port)"; VLLM_PORT="$(free_port)"; PROXY_PORT="$(free_port)"
kvmigrate emulate --profile hosted --port "$HOSTED_PORT" --time-scale 0.05 >"$WORK/hosted.log" 2>&1 &
PIDS+=($!)
kvmigrate emulate --profile vllm --port "$VLLM_PORT" --time-scale 0.05 >"$WORK/vllm.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$HOSTED_PORT/health"
wait_http "http://127.0.0.1:$VLLM_PORT/health"

step "a new config, from the example"
mkdir -p "$WORK/team" && cd "$WORK/team"
sed -e "s#https://api.openai.com/v1#http://127.0.0.1:$HOSTED_PORT/v1#" \
    -e "s#http://127.0.0.1:8000/v1#http://127.0.0.1:$VLLM_PORT/v1#" \
    -e "s#^  port: 4000#  port: $PROXY_PORT#" \
    -e "s/^    # min_parity: 0.9 /    min_parity: 0.5   /" \
    -e "s/^  bake_seconds: 600 /  bake_seconds: 2   /" \
    "$WORK/kvmigrate/config.yaml" >config.yaml
kvmigrate config check

step "Evaluate: doctor"
kvmigrate doctor --base-url "http://127.0.0.1:$VLLM_PORT/v1"
kvmigrate doctor --print-serve-command --model meta-llama/Llama-3.1-8B-Instruct --gpu H100
kvmigrate doctor --print-serve-command --model meta-llama/Llama-3.1-70B-Instruct --gpu L4

step "Evaluate: bench --vs --html"
kvmigrate bench --base-url "http://127.0.0.1:$VLLM_PORT/v1" --vs "http://127.0.0.1:$HOSTED_PORT/v1" \
    --conversations 4 --turns 4 --html bench.html

step "Pilot: rewrite a client project (dry run, then the printed command)"
mkdir -p services/api services/web services/deploy
cat >services/api/client.py <<'EOF'
from openai import OpenAI

client = OpenAI(base_url="https://api.openai.com/v1")
EOF
cat >services/web/chat.ts <<'EOF'
import OpenAI from "openai";
const client = new OpenAI({ baseURL: "https://api.openai.com/v1" });
export default client;
EOF
printf 'OPENAI_API_KEY=sk-live-playbook-0123456789abcdef\nOPENAI_BASE_URL=https://api.openai.com/v1\n' >services/.env
cat >services/deploy/docker-compose.yml <<'EOF'
services:
  agent:
    image: agent:latest
    environment:
      OPENAI_BASE_URL: https://api.openai.com/v1
EOF
cat >services/deploy/deployment.yaml <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: agent}
spec:
  template:
    spec:
      containers:
        - name: agent
          image: agent:latest
          env:
            - {name: OPENAI_BASE_URL, value: "https://api.openai.com/v1"}
EOF
(cd services && git init -q && git add -A && git -c user.name=p -c user.email=p@example.com commit -qm init)
allow "2" kvmigrate rewrite ./services --proxy-url "http://127.0.0.1:$PROXY_PORT/v1" | tee rewrite.txt
APPLY="$(sed -n 's/.*Apply with: //p' rewrite.txt)"
[[ -n "$APPLY" ]]
eval "$APPLY"  # pasted as printed
grep -q "127.0.0.1:$PROXY_PORT" services/.env
(cd services && git status --porcelain | grep -vq '\.kvmigrate' && ! git status --porcelain | grep -q '\.kvmigrate')

step "Pilot: the proxy in shadow, about 50 SDK conversations"
kvmigrate proxy >proxy.log 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$PROXY_PORT/health"
cat >conversations.py <<'EOF'
"""Agent-like conversations through the proxy with the official SDK."""
import sys
import time

import openai

base, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
until = time.time() + float(sys.argv[4]) if len(sys.argv) > 4 else None
tools = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
client = openai.OpenAI(base_url=base, api_key="sk-client", max_retries=2)
n = first
while True:
    for i in range(n, n + count):
        messages = [{"role": "system", "content": "You are a careful coding agent. " * 40},
                    {"role": "user", "content": f"Task {i}: find where the config is parsed."}]
        for turn in range(4):
            stream = client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, max_tokens=24, stream=True,
                tools=tools if turn % 2 else openai.NOT_GIVEN,
                extra_headers={"X-Session-ID": f"pilot-{i}"})
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"step {turn}: go on"}]
    n += count
    if until is None or time.time() > until:
        break
EOF
"$PY" conversations.py "http://127.0.0.1:$PROXY_PORT/v1" 0 50
sleep 2  # shadow copies finish and the recorder flushes

step "Pilot: report in every format, cachecheck, parity"
kvmigrate report
kvmigrate report --format md --out report.md
kvmigrate report --format json --out report.json
kvmigrate report --format html --out report.html --export-requests requests.jsonl
allow "0 2" kvmigrate cachecheck --dataset requests.jsonl
allow "0 1 3" kvmigrate parity --dataset requests.jsonl --min-score 0.9

step "Production: rollout status, --percent 10, auto, rollback, history"
kvmigrate rollout status
kvmigrate rollout --percent 10 --reason "pilot"
# auto bakes at each step and needs fresh evidence there: traffic keeps flowing meanwhile.
"$PY" conversations.py "http://127.0.0.1:$PROXY_PORT/v1" 1000 10 240 >traffic.log 2>&1 &
TRAFFIC=$!
PIDS+=("$TRAFFIC")
kvmigrate rollout auto --step-timeout 200
kill "$TRAFFIC" 2>/dev/null || true
kvmigrate rollout status
kvmigrate rollback --reason "p95 regression"
kvmigrate rollout history

CURRENT="done"
echo
echo "playbook passed: every step of the README ran on a fresh clone"
