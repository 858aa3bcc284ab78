"""A page open in a real headless Chromium, driven over the DevTools protocol: evaluate
script in it as a user's actions would run (choose an option, read what is shown).

`--dump-dom` only shows a page as it loaded; a test that changes a control and reads the
outcome needs the page kept open, which this gives, with no library beyond `websockets`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from services import missing
from websockets.sync.client import ClientConnection, connect

WAIT_S = 60.0  # a generous ceiling for Chromium to start under load, never a timing check


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    missing("Chromium", "chromium")


class Page:
    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    def evaluate(self, expression: str) -> Any:
        """The value of `expression` in the page (JSON-serialisable values only)."""
        sent = next(self._ids)
        message = {"id": sent, "method": "Runtime.evaluate"}
        message["params"] = {"expression": expression, "returnByValue": True}
        self._socket.send(json.dumps(message))
        while True:
            answer = json.loads(self._socket.recv(timeout=WAIT_S))
            if answer.get("id") != sent:
                continue  # an event, not our answer
            result = answer["result"]
            if "exceptionDetails" in result:
                raise AssertionError(f"{expression!r} threw: {result['exceptionDetails']}")
            return result["result"].get("value")

    def wait_for(self, expression: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not self.evaluate(expression):
            assert time.monotonic() < deadline, f"never true in the page: {expression}"
            time.sleep(0.05)


@contextmanager
def open_page(path: Path, fragment: str = "") -> Iterator[Page]:
    """`path` open in Chromium; `fragment` (`#view=...`) is added to its URL."""
    profile = Path(tempfile.mkdtemp(prefix="kvmigrate-chromium-"))
    proc = subprocess.Popen(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--remote-debugging-port=0",
         "--remote-allow-origins=*", path.as_uri() + fragment],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        port = _port(profile / "DevToolsActivePort", proc)
        url = _page_socket(port, path)
        with connect(url, max_size=None, open_timeout=WAIT_S) as socket:
            yield Page(socket)
    finally:
        _stop_group(proc)
        shutil.rmtree(profile, ignore_errors=True)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Chromium's own children (zygote, renderer, crash handler) outlive a terminated
    browser process and kept writing into the profile while it was removed, leaving
    /tmp/kvmigrate-chromium-* behind: the whole group goes, and is gone before the profile."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _port(active: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + WAIT_S
    while not (active.exists() and active.read_text().strip()):
        assert proc.poll() is None, "Chromium exited before it listened"
        assert time.monotonic() < deadline, "Chromium never wrote its DevTools port"
        time.sleep(0.05)
    return int(active.read_text().split()[0])


def _page_socket(port: int, path: Path) -> str:
    deadline = time.monotonic() + WAIT_S
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=WAIT_S) as r:
            targets = json.load(r)
        for target in targets:
            if target.get("type") == "page" and target.get("url", "").startswith(path.as_uri()):
                return str(target["webSocketDebuggerUrl"])
        assert time.monotonic() < deadline, f"no page for {path} among {targets}"
        time.sleep(0.05)
