"""The official Node `openai` package, for tests that drive the proxy as a Node agent does.

A Node client behaves unlike the Python SDK in ways the proxy must survive: its keep-alive
pool opens a second connection while the first is still held, so one agent's turns reach
different workers of `proxy --workers N`. The package is installed with npm, once, into a
folder in ~/.cache/kvmigrate (never into the checkout), under a `flock` so parallel test
runs do not install it twice; a marker file is written only once it loads.

Pinned to a release that runs on Debian's Node (18): later ones want Node 22.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kvmigrate.testbed.locking import file_lock

VERSION = "6.30.1"
DIR_ENV = "KVMIGRATE_NODE_OPENAI"
MARKER = ".kvmigrate-ready"
INSTALL_TIMEOUT_S = 300


class NodeMissing(RuntimeError):
    """No `node` or `npm` on PATH: the Node client tests cannot run here."""


def install_dir() -> Path:
    override = os.environ.get(DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "kvmigrate" / f"node-openai-{VERSION}"


def ensure_node_openai(directory: Path | None = None) -> Path:
    """The folder whose `node_modules` holds the `openai` package (installed if missing).
    Raises NodeMissing without node or npm, RuntimeError when npm fails."""
    directory = directory or install_dir()
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise NodeMissing("node and npm are needed (Debian: apt-get install nodejs npm)")
    if (directory / MARKER).exists():
        return directory
    with file_lock(directory.with_name(directory.name + ".lock")):
        if not (directory / MARKER).exists():
            directory.mkdir(parents=True, exist_ok=True)
            step = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(directory)]
            done = subprocess.run(
                [*step, f"openai@{VERSION}"],
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"npm install openai@{VERSION} failed:\n{done.stderr[-3000:]}")
            check = ["node", "-e", "require('openai')"]
            subprocess.run(check, cwd=directory, check=True, capture_output=True)
            (directory / MARKER).write_text(f"openai@{VERSION}\n")
    return directory
