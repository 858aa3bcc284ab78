"""Issue 26's table of deliberate bugs, re-run: each bug is applied to a scratch copy of the
tree, the test named for it in docs/mutation.md must fail, and must pass again once the file
is restored. Exits non-zero when a bug goes unnoticed or a named test fails on the real code.

    python scripts/mutation_table.py          every row (PYTHON: the test interpreter)
    python scripts/mutation_table.py floor    the rows whose bug mentions "floor"
    python scripts/mutation_table.py --before COMMIT i54
        the kill rate of the rows in OLD_FILES against the files that covered their code
        before, as they were at COMMIT (a row's own tests are not run): a miss is no problem
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PY = os.environ.get("PYTHON", sys.executable)
T = "tests/policies/test_gate_boundaries.py::"
CRED = (
    "tests/proxy/test_credential_tables.py"
    "::test_primary_behind_a_master_key_gets_no_client_credential_header"
)
SHAPE = "tests/security/test_security_tables.py::test_each_rule_catches_its_shape"
HASHES = "tests/migrate/test_migrate_backup_hashes.py::"
# (the bug, the file, the text replaced, its replacement, the tests that must catch it)
ROWS: list[tuple[str, str, str, str, list[str]]] = [
    (
        "drop cookie",
        "kvmigrate/credential_names.py",
        '"x-api-key", "cookie", "openai-organization"',
        '"x-api-key", "openai-organization"',
        [CRED + "[cookie]"],
    ),
    (
        "drop x-api-key and openai-project",
        "kvmigrate/credential_names.py",
        '"x-api-key", "cookie", "openai-organization", "openai-project"}',
        '"cookie", "openai-organization"}',
        [CRED + "[x-api-key]", CRED + "[openai-project]"],
    ),
    (
        "drop api-key",
        "kvmigrate/credential_names.py",
        '{"authorization", "api-key", "x-api-key", "cookie"',
        '{"authorization", "x-api-key", "cookie"',
        [CRED + "[api-key]"],
    ),
    (
        "remove JWT pattern",
        "kvmigrate/redaction.py",
        '    re.compile(_START + r"eyJ[A-Za-z0-9_-]{8,}\\.[A-Za-z0-9_-]{4,}\\.[A-Za-z0-9_-]*"),\n',
        "",
        [SHAPE + "[jwt]", SHAPE + "[unsigned jwt]"],
    ),
    (
        "remove GitHub/Slack/GitLab pattern",
        "kvmigrate/redaction.py",
        "github_pat|xox[abprs]|glpat)[-_]",
        "github_pat|xox[abprs]|glpat)[-_]NEVER",
        [SHAPE + "[github ghp]", SHAPE + "[slack xoxb]", SHAPE + "[gitlab]"],
    ),
    (
        "remove sk- pattern",
        "kvmigrate/redaction.py",
        'VENDOR_KEY = re.compile(_START + r"(?:sk|rk|pk)[-_][A-Za-z0-9_-]*+")',
        'VENDOR_KEY = re.compile(r"(?!)")',
        [SHAPE + "[openai key]"],
    ),
    (
        "skip backup-hash check in _classify",
        "kvmigrate/migrate/apply.py",
        'if not backup.is_file() or sha256(_read(backup)) != entry.get("sha256_before"):',
        "if not backup.is_file():",
        [
            HASHES + "test_tampered_backup_is_refused_and_nothing_is_written[appended]",
            HASHES + "test_tampered_backup_is_refused_and_nothing_is_written[truncated]",
        ],
    ),
    (
        "skip hash check after restore",
        "kvmigrate/migrate/apply.py",
        "if sha256(_read(target)) != entry",
        "if False and sha256(_read(target)) != entry",
        [HASHES + "test_restored_bytes_that_do_not_match_the_backup_are_reported"],
    ),
    (
        "disable 100 ms TTFT floor (verdict)",
        "kvmigrate/policies/ttft_gate.py",
        "floor = config.ttft_p95_floor_ms / 1000",
        "floor = 0.0",
        [T + "test_ttft_floor_and_slo_are_inclusive[0.1-config0-passed]"],
    ),
    (
        "disable 100 ms TTFT floor (no-primary path)",
        "kvmigrate/policies/ttft_gate.py",
        "ev.candidate_n, config)\n    if c.high * 1000 <= config.ttft_p95_floor_ms:",
        "ev.candidate_n, config)\n    if False:",
        [T + "test_without_a_primary_figure_the_floor_alone_passes_the_ttft_gate[0.1-100-passed]"],
    ),
    (
        "TTFT floor <= -> <",
        "kvmigrate/policies/ttft_gate.py",
        "if c.high <= floor or",
        "if c.high < floor or",
        [T + "test_ttft_floor_and_slo_are_inclusive[0.1-config0-passed]"],
    ),
    (
        "parity gate >= -> > (judge, parity minimum)",
        "kvmigrate/policies/sequential.py",
        "if high <= threshold:",
        "if high < threshold:",
        [T + "test_parity_minimum_is_held_to_the_reported_low_end_inclusively"],
    ),
    (
        "parity min_parity_samples >= -> >",
        "kvmigrate/policies/parity_gate.py",
        "enough = c.candidate_n >= config.min_parity_samples",
        "enough = c.candidate_n > config.min_parity_samples",
        [T + "test_a_comparator_counts_from_exactly_min_parity_samples[30-True]"],
    ),
    (
        "re-hash per percent (split)",
        "kvmigrate/policies/split.py",
        "return bucket(salt, key) < round(percent * 100)",
        "return bucket(salt + str(percent), key) < round(percent * 100)",
        ["tests/policies/test_policies.py::test_split_is_monotone_in_percent"],
    ),
    (
        "error gate <= -> < (judge)",
        "kvmigrate/policies/sequential.py",
        "if high <= threshold:",
        "if high < threshold:",
        [T + "test_error_margin_is_held_to_the_reported_bounds_inclusively"],
    ),
    (
        "error gate > -> >= (judge)",
        "kvmigrate/policies/sequential.py",
        "if low > threshold:",
        "if low >= threshold:",
        [T + "test_error_margin_is_held_to_the_reported_bounds_inclusively"],
    ),
]

# Issue 54: realistic bugs in the security and decision code, each named for what the
# client or an upstream would see. `OLD_FILES`: the test files that covered that code
# before issue 54's tables (`--before COMMIT` runs those, from COMMIT's tests/).
UP = "tests/proxy/test_upstream_contract.py"
UPK = "tests/proxy/test_upstream_contract_kinds.py"
ERR = "tests/proxy/test_error_contract.py"
KEYS = "tests/proxy/test_exact_keys.py"
EXACT = "tests/security/test_exact_matching.py"
DEFAULTS = "tests/config/test_config_defaults.py"
RECORD = "tests/proxy/test_record_contract.py"
_PATHS = "tests/continuity/test_lookup_paths.py::"
CHAIN = _PATHS + "test_a_responses_chain_stays_on_the_backend_that_stored_its_first_turn"
TALK = _PATHS + "test_a_conversation_whose_system_prompt_changes_stays_on_one_backend"
ROWS += [
    (
        "i54 candidate gets the client's headers",
        "kvmigrate/proxy/calls.py",
        "else candidate_view(request.headers, upstream.candidate_headers),",
        "else request.headers,",
        [UP, UPK],
    ),
    (
        "i54 open-mode primary gets the client's credentials",
        "kvmigrate/proxy/calls.py",
        "passes = primary and self.passes_credentials",
        "passes = primary and self.config.server.master_key is None",
        [UP, UPK],
    ),
    (
        "i54 headers named in Connection forwarded",
        "kvmigrate/proxy/headers.py",
        "if lower in HOP_BY_HOP or lower in listed:",
        "if lower in HOP_BY_HOP:",
        [UP, UPK],
    ),
    (
        "i54 502 carries the exception text",
        "kvmigrate/proxy/forward.py",
        "raise UpstreamFailure(kind, upstream_unreachable(upstream.name)) from None",
        "raise UpstreamFailure(kind, upstream_unreachable(f'{upstream.name} ({exc})')) from None",
        [ERR],
    ),
    (
        "i54 key compared with == instead of compare_digest",
        "kvmigrate/config/secret.py",
        "        return hmac.compare_digest(",
        "        return (lambda a, b: a == b)(",
        [KEYS, EXACT],
    ),
    (
        "i54 key matched by prefix",
        "kvmigrate/config/secret.py",
        "        return hmac.compare_digest(",
        "        return (lambda a, b: b.startswith(a))(",
        [KEYS],
    ),
    (
        "i54 metrics key matched by prefix",
        "kvmigrate/proxy/app.py",
        "if token is None or not key.matches(token):",
        "if token is None or not token.startswith(key.reveal()):",
        [KEYS, EXACT],
    ),
    (
        "i54 header selector matched by substring",
        "kvmigrate/policies/cohorts.py",
        "and all(headers.get(name) == want for name, want in selector.headers)",
        "and all(want in (headers.get(name) or '') for name, want in selector.headers)",
        [EXACT],
    ),
    (
        "i54 metadata selector matched without case",
        "kvmigrate/policies/cohorts.py",
        "values.get(name) == want",
        "str(values.get(name)).lower() == want.lower()",
        [EXACT],
    ),
    (
        "i54 hashed id taken by its prefix",
        "kvmigrate/rollout/keys.py",
        "and len(key) == len(HASHED_PREFIX) + HASH_HEX_DIGITS",
        "and len(key) >= len(HASHED_PREFIX) + HASH_HEX_DIGITS",
        [EXACT],
    ),
    (
        "i54 hashed conversation recovered by a prefix",
        "kvmigrate/rollout/keys.py",
        "if candidate and self.key(candidate) == stored:",
        "if candidate and stored.startswith(self.key(candidate)[:12]):",
        [EXACT],
    ),
    (
        "i54 records' key not derived from the store",
        "kvmigrate/recorder/addon.py",
        "key = keys.records_key()",
        "key = None",
        [EXACT],
    ),
    (
        "i54 read_timeout default grows tenfold",
        "kvmigrate/config/model.py",
        "read_timeout: Annotated[float, Meta(ge=0.001)] = 600.0",
        "read_timeout: Annotated[float, Meta(ge=0.001)] = 6000.0",
        [DEFAULTS],
    ),
    (
        "i54 client_key_ttl_seconds default moves",
        "kvmigrate/config/model.py",
        "client_key_ttl_seconds: Annotated[float, Meta(ge=1.0, le=86400.0)] = 300.0",
        "client_key_ttl_seconds: Annotated[float, Meta(ge=1.0, le=86400.0)] = 3000.0",
        [DEFAULTS],
    ),
    (
        "i54 store-less chain lookup forgets",
        "kvmigrate/continuity/chains.py",
        "        entry = self._local.get(key)\n",
        "        entry = None\n",
        [CHAIN + "[memory]"],
    ),
    (
        "i54 chain ids not read from the store",
        "kvmigrate/continuity/chains.py",
        "        if self.links.store is None:\n            return None\n        links = await",
        "        if True:\n            return None\n        links = await",
        [CHAIN + "[sqlite]", CHAIN + "[redis]"],
    ),
    (
        "i54 workers' link table not read",
        "kvmigrate/continuity/resolver.py",
        "found = self._table_link(history)",
        "found = None",
        [TALK + "[table]"],
    ),
    (
        "i54 store's conversation links not read",
        "kvmigrate/continuity/resolver.py",
        "found = await self._remote(history)",
        "found = None",
        [TALK + "[sqlite]", TALK + "[redis]"],
    ),
    (
        "i54 redaction keeps emails",
        "kvmigrate/redaction.py",
        '    if "@" in text:\n',
        "    if False:\n",
        [RECORD],
    ),
    (
        "i54 a Cookie line keeps its second cookie",
        "kvmigrate/named_secrets.py",
        'if "cookie" in name or ("authorization" in name',
        'if ("authorization" in name',
        [RECORD],
    ),
    (
        "i54 records keep the declared session id",
        "kvmigrate/recorder/convert.py",
        'if content == "full" or not conversation',
        "if True or not conversation",
        [RECORD],
    ),
]
_PROXY = ["tests/proxy/test_forwarding.py", "tests/proxy/test_credential_tables.py"]
OLD_FILES: dict[str, list[str]] = {
    "i54 candidate gets the client's headers": _PROXY,
    "i54 open-mode primary gets the client's credentials": _PROXY,
    "i54 headers named in Connection forwarded": _PROXY,
    "i54 502 carries the exception text": ["tests/proxy/test_errors.py"],
    "i54 key compared with == instead of compare_digest": [
        "tests/config/test_secret.py",
        "tests/config/test_config.py",
        "tests/proxy/test_errors.py",
    ],
    "i54 key matched by prefix": [
        "tests/config/test_secret.py",
        "tests/config/test_config.py",
        "tests/proxy/test_errors.py",
    ],
    "i54 metrics key matched by prefix": [
        "tests/proxy/test_service_routes.py",
        "tests/proxy/test_hardening.py",
    ],
    "i54 header selector matched by substring": ["tests/cohorts/test_cohort_resolution.py"],
    "i54 metadata selector matched without case": ["tests/cohorts/test_cohort_resolution.py"],
    "i54 hashed id taken by its prefix": ["tests/continuity/test_store_keys.py"],
    "i54 hashed conversation recovered by a prefix": ["tests/continuity/test_store_keys.py"],
    "i54 records' key not derived from the store": ["tests/continuity/test_store_keys.py"],
    "i54 read_timeout default grows tenfold": [
        "tests/config/test_config.py",
        "tests/config/test_config_reference.py",
    ],
    "i54 client_key_ttl_seconds default moves": [
        "tests/config/test_config.py",
        "tests/config/test_config_reference.py",
    ],
}


def run(root: Path, test: str) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    # Paths are separated by spaces; a node id's parameters may hold spaces of their own
    # (`...[unsigned jwt]`), so a space inside brackets does not split.
    paths = re.findall(r"(?:[^\s\[]+|\[[^\]]*\])+", test)
    argv = [PY, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *paths]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)
    return done.returncode, (done.stdout.strip().splitlines() or ["?"])[-1]


def main() -> int:
    here = Path(__file__).resolve().parent.parent
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=here,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="kvmigrate-table-") as scratch:
        root = Path(scratch)
        for name in files:
            if (here / name).is_file():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(here / name, root / name)
        wanted = sys.argv[1:]
        before = None
        if wanted[:1] == ["--before"]:
            before, wanted = wanted[1], wanted[2:]
            shutil.rmtree(root / "tests")
            tests_then = subprocess.run(
                ["git", "archive", before, "tests"], cwd=here, capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(root)], input=tests_then, check=True)
        killed = tried = 0
        for bug, path, old, new, tests in ROWS:
            if wanted and not any(w in bug for w in wanted):
                continue
            if before is not None:
                if bug not in OLD_FILES:
                    continue
                tests = [" ".join(OLD_FILES[bug])]
            text = (root / path).read_text()
            if text.count(old) != 1:
                print(f"STALE  {bug}: the text to replace is not in {path} once")
                bad += 1
                continue
            (root / path).write_text(text.replace(old, new))
            try:
                for test in tests:
                    code, last = run(root, test)
                    caught = code == 1 and "failed" in last
                    bad += not caught and before is None
                    killed, tried = killed + caught, tried + 1
                    print(f"{'CAUGHT' if caught else 'MISSED'} {bug}: {test} ({last})", flush=True)
            finally:
                (root / path).write_text(text)
            for test in tests if before is None else ():
                code, last = run(root, test)
                if code != 0:
                    bad += 1
                    print(f"FAILS ON THE REAL CODE {test} ({last})")
    print(f"{len(ROWS)} bugs, {bad} problems; caught {killed} of {tried} runs")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
