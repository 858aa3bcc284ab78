"""`kvmigrate rewrite` as a library: point client code and deployment configs at the proxy.

plan = build_plan(Path("."), RewriteOptions(proxy_url="http://127.0.0.1:4000/v1"))
print(plan_text(plan, applied=None, show_diff=True))
result = apply_plan(plan)          # backups + manifest first, then atomic writes
revert(Path("."), result.backup_id)
"""

from kvmigrate.migrate.apply import (
    ApplyError,
    ApplyResult,
    DirtyTree,
    RevertError,
    RevertResult,
    apply_plan,
    list_backups,
    revert,
)
from kvmigrate.migrate.findings import Action, Finding, Problem, Severity
from kvmigrate.migrate.plan import FileChange, Plan, build_plan
from kvmigrate.migrate.report import plan_json, plan_text, revert_json, revert_text
from kvmigrate.migrate.values import (
    DEFAULT_PROXY_URL,
    RewriteOptions,
    proxy_url_for_server,
    validate_proxy_key,
    validate_proxy_url,
)

__all__ = [
    "DEFAULT_PROXY_URL",
    "Action",
    "ApplyError",
    "ApplyResult",
    "DirtyTree",
    "FileChange",
    "Finding",
    "Plan",
    "Problem",
    "RevertError",
    "RevertResult",
    "RewriteOptions",
    "Severity",
    "apply_plan",
    "build_plan",
    "list_backups",
    "plan_json",
    "plan_text",
    "proxy_url_for_server",
    "revert",
    "revert_json",
    "revert_text",
    "validate_proxy_key",
    "validate_proxy_url",
]
