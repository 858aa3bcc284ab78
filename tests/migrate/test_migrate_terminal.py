"""A scanned repository is anyone's: an escape sequence, a bidi control or a lone carriage
return in a file (or its name) reaches the terminal escaped in rewrite's text output, so
the diff a reviewer reads is the one that gets written ("Trojan Source")."""

from __future__ import annotations

import json
from pathlib import Path

from migrate_support import PROXY, invoke


def _tree(root: Path) -> Path:
    root.mkdir()
    (root / ".env").write_bytes(
        b"OPENAI_BASE_URL=https://api.openai.com/v1\n"
        b"# \x1b[2K\xe2\x80\xae owned\n"  # erase the line, then a right-to-left override
        b"MODE=safe\rMODE=evil\n"  # a lone CR: a terminal would show only the second half
    )
    (root / "crlf.env").write_bytes(b"OPENAI_BASE_URL=https://api.openai.com/v1\r\n")
    (root / "x\x1b[31m.yaml").write_bytes(b"a: [\n")  # an error names the file
    return root


def test_text_output_escapes_what_a_terminal_would_act_on(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    result = invoke(str(tree), "--proxy-url", PROXY, cwd=tmp_path)
    out = result.stdout + result.stderr
    for raw in ("\x1b", "\u202e", "\r"):
        assert raw not in out, repr(out)
    assert " # \\x1b[2K\\u202e owned\n" in out
    assert " MODE=safe\n" in out  # the diff breaks the line there: both halves shown
    assert " MODE=evil\n" in out
    assert "-OPENAI_BASE_URL=https://api.openai.com/v1\n" in out  # the CRLF file's line
    assert "x\\x1b[31m.yaml: parse: " in out
    assert (tree / "crlf.env").read_bytes().endswith(b"\r\n")  # untouched by a dry run


def test_json_keeps_the_bytes_escaped_as_json(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    out = invoke(str(tree), "--proxy-url", PROXY, "--json", cwd=tmp_path).stdout
    assert "\x1b" not in out
    diff = next(c["diff"] for c in json.loads(out)["changes"] if c["path"] == ".env")
    assert "\x1b[2K\u202e owned" in diff  # exact, for a machine
