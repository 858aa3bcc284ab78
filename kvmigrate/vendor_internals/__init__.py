"""Where kvmigrate reaches below a library's public API: one module per library.

Every private attribute, private method or layout trick kvmigrate relies on is named in the
library's module here (`PRIVATE_NAMES`: each name with the feature that needs it and why the
public API does not do), and touched nowhere else. The contract tests
(`tests/private_api/test_*_contracts.py`) check each of them against the installed library,
so that an upgrade that moves one fails a test naming it instead of breaking the proxy
silently; `tests/private_api/test_private_api_guard.py` checks that no other module names
them. The libraries are pinned (pyproject.toml) to the
minor versions those tests pass on: raising a pin starts with running them.
"""
