#!/usr/bin/env bash
# Mutation testing of the decision- and security-critical modules, with mutmut 3.
#
#   scripts/mutation.sh                      every module in \$default below
#   scripts/mutation.sh headers secret       only those (names from the table below)
#
# Each module is mutated in its own scratch copy of the tree (mutmut reads its config from
# ./pyproject.toml and writes ./mutants/), against only the tests that cover it, so a run on
# one module takes minutes, not hours. Prints the kill rate per module; exits non-zero when
# one is under MIN_KILL_RATE (default 90). Survivors judged equivalent: docs/mutation.md.
#
# Needs mutmut importable by $PYTHON (the `test` extra installs it); MUTMUT_PATH, if set,
# is prepended to PYTHONPATH (for a mutmut installed with `pip install --target`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PYTHON=${PYTHON:-$root/.venv/bin/python}
MIN_KILL_RATE=${MIN_KILL_RATE:-90}
scratch=${MUTATION_DIR:-${TMPDIR:-/tmp}/kvmigrate-mutation-$$}

# name | glob(s) to mutate | test files that must kill its mutants | equivalence rules
# An equivalence rule sets aside survivors that a machine check proves equivalent (below):
#   sql-case   the mutant differs from the original only in the letter case of SQL text
#              (SQLite keywords, table, column and pragma names are case-insensitive)
modules=(
  "policies|kvmigrate/policies/*|tests/policies/test_gates.py tests/policies/test_gate_boundaries.py tests/policies/test_sequential.py tests/policies/test_split_boundaries.py tests/policies/test_policies.py tests/policies/test_route.py tests/policies/test_continuity.py"
  "split|kvmigrate/policies/split.py|tests/policies/test_split_boundaries.py tests/policies/test_policies.py tests/policies/test_route.py"
  # the gates one module at a time (the figure per module), against every gate test
  "gates|kvmigrate/policies/gates.py|tests/policies/test_gates.py tests/policies/test_gate_boundaries.py tests/policies/test_sequential.py tests/policies/test_gate_reports.py tests/policies/test_parity_gate_report.py tests/policies/test_ttft_gate_report.py"
  "error_gate|kvmigrate/policies/error_gate.py|tests/policies/test_gates.py tests/policies/test_gate_boundaries.py tests/policies/test_sequential.py tests/policies/test_gate_reports.py tests/policies/test_parity_gate_report.py tests/policies/test_ttft_gate_report.py"
  "ttft_gate|kvmigrate/policies/ttft_gate.py|tests/policies/test_gates.py tests/policies/test_gate_boundaries.py tests/policies/test_sequential.py tests/policies/test_gate_reports.py tests/policies/test_parity_gate_report.py tests/policies/test_ttft_gate_report.py"
  "parity_gate|kvmigrate/policies/parity_gate.py|tests/policies/test_gates.py tests/policies/test_gate_boundaries.py tests/policies/test_sequential.py tests/policies/test_gate_reports.py tests/policies/test_parity_gate_report.py tests/policies/test_ttft_gate_report.py"
  "sequential|kvmigrate/policies/sequential.py|tests/policies/test_gates.py tests/policies/test_gate_boundaries.py tests/policies/test_sequential.py tests/policies/test_gate_reports.py tests/policies/test_parity_gate_report.py tests/policies/test_ttft_gate_report.py"
  "headers|kvmigrate/proxy/headers.py|tests/proxy/test_credential_tables.py"
  "body|kvmigrate/proxy/body.py|tests/proxy/test_body.py"
  "redaction|kvmigrate/redaction.py|tests/security/test_security_tables.py tests/security/test_redaction.py tests/security/test_redaction_boundaries.py"
  "apply|kvmigrate/migrate/apply.py|tests/migrate/test_migrate_apply_tables.py tests/migrate/test_migrate_apply.py tests/migrate/test_migrate_backups.py tests/migrate/test_migrate_backup_hashes.py"
  "secret|kvmigrate/config/secret.py|tests/config/test_secret.py tests/config/test_config_unset_secrets.py tests/proxy/test_errors.py"
  "store|kvmigrate/rollout/sqlite_store.py|tests/rollout/test_sqlite_store_table.py tests/rollout/test_rollout_stored_values.py tests/continuity/test_continuity_store.py|sql-case"
  # policies/ one module at a time: the figure per module the issue asks for, in minutes each
  "route|kvmigrate/policies/route.py|tests/policies/test_pinning.py tests/policies/test_policies.py tests/policies/test_route.py tests/policies/test_continuity.py tests/policies/test_split_boundaries.py"
  "pinning|kvmigrate/policies/pinning.py|tests/policies/test_pinning.py tests/policies/test_policies.py tests/policies/test_route.py tests/policies/test_continuity.py tests/policies/test_split_boundaries.py"
  "outcome|kvmigrate/policies/outcome.py|tests/policies/test_outcome.py tests/policies/test_policies.py tests/policies/test_route.py tests/policies/test_continuity.py tests/policies/test_split_boundaries.py tests/policies/test_gates.py"
  "continuity|kvmigrate/policies/continuity.py|tests/policies/test_continuity_tables.py tests/policies/test_policies.py tests/policies/test_route.py tests/policies/test_continuity.py tests/policies/test_split_boundaries.py"
  "volatile|kvmigrate/policies/volatile.py|tests/policies/test_volatile_lines.py tests/policies/test_policies.py tests/policies/test_route.py tests/policies/test_continuity.py tests/policies/test_split_boundaries.py"
  "conversation|kvmigrate/policies/conversation.py|tests/policies/test_conversation_keys.py tests/policies/test_policies.py tests/policies/test_route.py tests/policies/test_continuity.py tests/policies/test_continuity_tables.py tests/policies/test_split_boundaries.py tests/wire/test_wire_anthropic.py tests/policies/test_chain.py"
  "decision|kvmigrate/policies/decision.py|tests/policies/test_pinning.py tests/policies/test_policies.py tests/policies/test_route.py tests/policies/test_continuity.py tests/policies/test_split_boundaries.py"
  "replicas|kvmigrate/policies/replicas.py|tests/replicas/test_replicas_tables.py tests/replicas/test_replicas_policy.py tests/policies/test_policies.py tests/policies/test_route.py"
  "tool_calls|kvmigrate/policies/tool_calls.py|tests/policies/test_tool_calls.py tests/policies/test_gates.py tests/policies/test_gate_boundaries.py tests/policies/test_policies.py"
  "window|kvmigrate/policies/window.py|tests/policies/test_gates.py tests/policies/test_gate_boundaries.py tests/policies/test_policies.py"
  "chain|kvmigrate/policies/chain.py|tests/policies/test_chain.py"
  "cohorts|kvmigrate/policies/cohorts.py|tests/cohorts/test_cohort_resolution.py"
  "candidate_compare|kvmigrate/policies/candidate_compare.py|tests/policies/test_candidate_compare.py tests/policies/test_candidate_compare_report.py"
  "gate_model|kvmigrate/policies/gate_model.py|tests/policies/test_gates.py tests/policies/test_gate_boundaries.py tests/policies/test_sequential.py tests/policies/test_gate_reports.py tests/policies/test_parity_gate_report.py tests/policies/test_ttft_gate_report.py"
  # issue 54's further modules: who gets in, what is forwarded, what is stored, which backend
  "intervals|kvmigrate/intervals.py|tests/policies/test_intervals.py tests/policies/test_sequential.py"
  "errors|kvmigrate/proxy/errors.py|tests/proxy/test_error_envelopes.py"
  "proxy_cohorts|kvmigrate/proxy/cohorts.py|tests/cohorts/test_cohort_shared_keys.py tests/cohorts/test_cohort_resolution.py tests/security/test_exact_matching.py"
  "convert|kvmigrate/recorder/convert.py|tests/recorder/test_convert_tables.py tests/proxy/test_exchange.py tests/recorder/test_messages_answers.py tests/recorder/test_recorder_decode.py tests/recorder/test_recorder_history.py tests/recorder/test_recorder_deep_bodies.py"
  "controller|kvmigrate/rollout/controller.py|tests/rollout/test_controller_tables.py tests/rollout/test_rollout_change_rules.py tests/rollout/test_rollout_status_gates.py tests/cohorts/test_candidate_choice.py tests/cohorts/test_cohort_candidate_removed.py"
  "config_model|kvmigrate/config/model.py|tests/config/test_config_model_lookups.py tests/cohorts/test_cohort_resolution.py"
  "admin_api|kvmigrate/proxy/admin_api.py|tests/rollout/test_admin_api_table.py tests/rollout/test_admin_api_bodies.py tests/rollout/test_admin_api_bounds.py tests/rollout/test_admin_api_echo.py tests/rollout/test_admin_key_alone.py"
  "chained|kvmigrate/proxy/chained.py|tests/proxy/test_chained_table.py"
  "forward|kvmigrate/proxy/forward.py|tests/proxy/forward/test_forward_relay.py tests/proxy/forward/test_forward_failures.py"
  "resolver|kvmigrate/continuity/resolver.py|tests/continuity/test_resolver_table.py tests/continuity/test_link_writer_table.py tests/continuity/test_continuity_store.py tests/continuity/test_lookup_paths.py tests/continuity/test_send_before_identity.py tests/continuity/test_long_answers.py tests/continuity/test_store_keys.py tests/continuity/test_shadow_id_table.py tests/policies/test_continuity.py tests/proxy/test_chained_table.py"
)
# policies/ module by module (the whole package at once is the "policies" row). mutmut skips
# decorated functions, properties included: a property's logic lives in a plain function.
default="headers body redaction apply secret store split route pinning outcome continuity
  volatile conversation decision replicas tool_calls window chain cohorts candidate_compare
  gates error_gate ttft_gate parity_gate sequential gate_model
  intervals errors proxy_cohorts convert controller config_model"
wanted=${*:-$default}

export PYTHONPATH=${MUTMUT_PATH:+$MUTMUT_PATH}
"$PYTHON" -c "import mutmut" 2>/dev/null || {
  echo "mutmut is not importable by $PYTHON: pip install -e '.[test]'" >&2
  exit 2
}

status=0
summary=()
for want in $wanted; do
  row=$(printf '%s\n' "${modules[@]}" | grep "^$want|") || { echo "unknown module: $want" >&2; exit 2; }
  IFS='|' read -r name globs tests rules <<<"$row"
  work=$scratch/$name
  rm -rf "$work" && mkdir -p "$work"
  # The tracked tree plus this checkout's uncommitted files: what the tests read.
  git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$work"
  "$PYTHON" - "$work/pyproject.toml" "$globs" "$tests" <<'PY'
import json, pathlib, re, sys
path, globs, tests = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
text = open(path).read()
# mutmut runs the tests in mutants/, a copy of the sources and `also_copy`: every top-level
# file and folder the tests may read (config.yaml, docs/, deploy/, ...).
top = sorted(p.name for p in pathlib.Path(path).parent.iterdir() if p.name not in ("kvmigrate", ".git"))
text = text.replace("[tool.mutmut]\n", "[tool.mutmut]\nalso_copy = " + json.dumps(top) + "\n", 1)
text = re.sub(r"only_mutate = \[.*?\]\n", "only_mutate = " + json.dumps(globs) + "\n", text, flags=re.S)
text = re.sub(r"pytest_add_cli_args_test_selection = \[.*?\]\n",
              "pytest_add_cli_args_test_selection = " + json.dumps(tests) + "\n", text, flags=re.S)
open(path, "w").write(text)
PY
  echo "== $name: mutating $globs against $tests"
  (cd "$work" && "$PYTHON" -m mutmut run --max-children "${MUTATION_JOBS:-2}" >"$work/run.log" 2>&1) || {
    echo "mutmut failed for $name, see $work/run.log" >&2
    tail -20 "$work/run.log" >&2
    status=1
    continue
  }
  line=$(cd "$work" && "$PYTHON" - "$MIN_KILL_RATE" "${rules:-}" <<'PY'
import ast, json, pathlib, re, sys
# mutmut's exit codes per mutant: the test run failing (1, or a timeout/crash) kills it;
# 0 is a survivor; 33 means no test reached the mutated function.
rules = set(sys.argv[2].split(","))
# Text that SQLite reads as a statement or a clause of one, with no quoted literal whose case
# would matter: a case change anywhere in it is invisible to SQLite.
SQL = re.compile(r"\s*(SELECT|INSERT|DELETE|UPDATE|CREATE|PRAGMA|BEGIN|COMMIT|ROLLBACK|WHERE)\b")


def sql_upper(tree: ast.AST) -> str:
    """The function's AST with every SQL string (or f-string) upper-cased, as text."""
    for node in ast.walk(tree):
        parts = node.values if isinstance(node, ast.JoinedStr) else [node]
        texts = [p for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)]
        if texts and texts[0] is parts[0] and not isinstance(node, ast.FormattedValue):
            if SQL.match(texts[0].value.upper()) and not any("'" in t.value for t in texts):
                for t in texts:
                    t.value = t.value.upper()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            node.name = ""
    return ast.dump(tree)


def functions(path: pathlib.Path, cache: dict[pathlib.Path, dict[str, ast.AST]]) -> dict[str, ast.AST]:
    if path not in cache:
        tree = ast.parse(path.read_text())
        cache[path] = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    return cache[path]


def sql_case_only(key: str, cache: dict[pathlib.Path, dict[str, ast.AST]]) -> bool:
    module, _, name = key.rpartition(".")
    defs = functions(pathlib.Path("mutants", *module.split(".")).with_suffix(".py"), cache)
    original = defs.get(name.rpartition("__mutmut_")[0] + "__mutmut_orig")
    mutant = defs.get(name)
    return bool(original and mutant) and sql_upper(original) == sql_upper(mutant)


killed = survived = untested = equivalent = 0
names = []
cache: dict[pathlib.Path, dict[str, ast.AST]] = {}
for meta in pathlib.Path("mutants").rglob("*.meta"):
    for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
        if code is None or code == 34:
            continue
        if code == 0 and "sql-case" in rules and sql_case_only(key, cache):
            equivalent += 1
            names.append(key + " (equivalent: SQL case)")
        elif code == 0:
            survived += 1
            names.append(key)
        elif code == 33:
            untested += 1
            names.append(key + " (no test)")
        else:
            killed += 1
total = killed + survived + untested + equivalent
raw = 100.0 * killed / total if total else 100.0
rest = total - equivalent
rate = 100.0 * killed / rest if rest else 100.0
head = f"{rate:.1f}% killed ({killed}/{rest}; {survived} survived, {untested} untested)"
if equivalent:
    head += f"; {equivalent} more set aside as equivalent by rule, {raw:.1f}% of all {total}"
print(head)
for n in sorted(names):
    print("   survivor:", n)
sys.exit(0 if rate >= float(sys.argv[1]) else 3)
PY
  ) && rc=0 || rc=$?
  echo "$line"
  summary+=("$(printf '%-10s %s' "$name" "$(head -1 <<<"$line")")")
  [ "$rc" -eq 0 ] || status=1
done
echo
echo "kill rate per module (mutmut; scratch trees in $scratch):"
printf '  %s\n' "${summary[@]}"
exit $status
