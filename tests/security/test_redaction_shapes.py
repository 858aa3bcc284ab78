"""Secret shapes an outside probe found in a recorded prompt with `record.content:
redacted`: YAML blocks, numbered names, XML elements, cookie lines, typographic and triple
quotes, unknown authorization schemes, URL passwords, command-line flags. Each goes whole,
through the recorder's own path (a chat message given to a `Redactor`); names that only
resemble a secret's keep their values; hostile input stays linear."""

from __future__ import annotations

import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvmigrate.named_secrets import is_secret_name
from kvmigrate.redaction import SECRET, Redactor, redact_text

# Typographic quotes, by name: English double and single, German low, guillemets, CJK
# corner brackets; and the full-width colon.
LDQ, RDQ, LSQ, RSQ, LOW_DQ = "\u201c", "\u201d", "\u2018", "\u2019", "\u201e"
LAQ, RAQ, LCB, RCB, FW_COLON = "\u00ab", "\u00bb", "\u300c", "\u300d", "\uff1a"
NAMED = {"LDQ": LDQ, "RDQ": RDQ, "LSQ": LSQ, "RSQ": RSQ, "LAQ": LAQ, "RAQ": RAQ, "LCB": LCB,
         "RCB": RCB, "FW_COLON": FW_COLON}  # fmt: skip

SHAPES = [
    ("yaml block |", "db:\n  password: |\n    Zq1a\n    Zq1b\n  user: bob",
     f"db:\n  password: |\n    {SECRET}\n  user: bob"),
    ("yaml block >- with blank line", "password: >-\n  Zq2a\n\n  Zq2b\nnext: 1",
     f"password: >-\n  {SECRET}\nnext: 1"),
    ("yaml block in a list, CRLF", "- token: |\r\n    Zq3\r\n- name: x",
     f"- token: |\r\n    {SECRET}\r\n- name: x"),
    ("numbered env name", "OPENAI_API_KEY_2=Zq4 next", f"OPENAI_API_KEY_2={SECRET} next"),
    ("numbered password", "DB_PASSWORD_1=Zq5", f"DB_PASSWORD_1={SECRET}"),
    ("numbered camelCase", '{"apiKey2": "Zq6 a"}', f'{{"apiKey2": "{SECRET}"}}'),
    ("xml password", "<password>Zq7</password>", f"<password>{SECRET}</password>"),
    ("xml apiKey with attribute", '<apiKey env="x">Zq8</apiKey>', f'<apiKey env="x">{SECRET}</apiKey>'),
    ("xml secret over lines", "<secret>\nZq9a\nZq9b\n</secret>", f"<secret>{SECRET}</secret>"),
    ("cookie header", "Cookie: theme=dark; sessionid=Zq10; csrftoken=Zq11\nHost: a",
     f"Cookie: {SECRET}\nHost: a"),
    ("set-cookie header", "Set-Cookie: sessionid=Zq12; Path=/; HttpOnly",
     f"Set-Cookie: {SECRET}"),
    ("curly double quotes", f"password: {LDQ}correct horse staple{RDQ} ok", f"password: {LDQ}{SECRET}{RDQ} ok"),
    ("curly single quotes", f"password: {LSQ}Zq13 a{RSQ} ok", f"password: {LSQ}{SECRET}{RSQ} ok"),
    ("guillemets", f"password: {LAQ}Zq14 a{RAQ} ok", f"password: {LAQ}{SECRET}{RAQ} ok"),
    ("corner brackets", f"password: {LCB}Zq15 a{RCB} ok", f"password: {LCB}{SECRET}{RCB} ok"),
    ("german quotes", f"password: {LOW_DQ}Zq16 a{LDQ} ok", f"password: {LOW_DQ}{SECRET}{LDQ} ok"),
    ("toml triple double quotes", 'password = """Zq17\nZq18"""\nx = 1',
     f'password = """{SECRET}"""\nx = 1'),
    ("python triple single quotes", "password = '''Zq19 a''' ok", f"password = '''{SECRET}''' ok"),
    ("unclosed triple quotes", 'secret = """Zq20\nZq21', f'secret = """{SECRET}'),
    ("authorization ssws", "Authorization: SSWS Zq22.a", f"Authorization: {SECRET}"),
    ("authorization token", "Authorization: Token Zq23 ok", f"Authorization: {SECRET} ok"),
    ("authorization digest", 'Authorization: Digest username="u", response="Zq24"',
     f'Authorization: {SECRET}"'),
    ("proxy-authorization", "Proxy-Authorization: Custom Zq25\nx", f"Proxy-Authorization: {SECRET}\nx"),
    ("postgres url", "postgres://admin:Zq26@db:5432/app", f"postgres://admin:{SECRET}@db:5432/app"),
    ("https url", "see https://user:Zq27@example.com/x ok", f"see https://user:{SECRET}@example.com/x ok"),
    ("full-width colon", f"password{FW_COLON}Zq28 ok", f"password{FW_COLON}{SECRET} ok"),
    ("arrow", "password -> Zq29 ok", f"password -> {SECRET} ok"),
    ("PASS", "PASS=Zq30 ok", f"PASS={SECRET} ok"),
    ("pass member", '{"pass": "Zq31"}', f'{{"pass": "{SECRET}"}}'),
    ("glued env name", "PGPASSWORD=Zq32 psql", f"PGPASSWORD={SECRET} psql"),
    ("--password x", "run --password Zq33 --verbose", f"run --password {SECRET} --verbose"),
    ("--password=x", "run --password=Zq34 ok", f"run --password={SECRET} ok"),
    ("--api-key quoted", "run --api-key 'Zq35 a' ok", f"run --api-key '{SECRET}' ok"),
    ("curl -u", "curl -u admin:Zq36 https://x", f"curl -u admin:{SECRET} https://x"),
    ("curl --user=", "curl --user=admin:Zq37 https://x", f"curl --user=admin:{SECRET} https://x"),
    ("mysql -p", "mysql -u root -pZq38 app", f"mysql -u root -p{SECRET} app"),
    ("comparison", "if password == 'Zq39':", f"if password == '{SECRET}':"),
]  # fmt: skip


def through_a_message(text: str) -> str:
    """The recorder's path: a chat message given to the writer's `Redactor`."""
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    content = Redactor()(body)["messages"][0]["content"]
    assert isinstance(content, str)
    return content


@pytest.mark.parametrize(("shape", "text", "expected"), SHAPES, ids=[s[0] for s in SHAPES])
def test_each_secret_shape_goes_whole(shape: str, text: str, expected: str) -> None:
    assert through_a_message(text) == expected
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("key", "secret"),
    [("apiKey2", True), ("OPENAI_API_KEY_2", True), ("pass", True), ("PGPASSWORD", True),
     ("OPENAI_KEY", True), ("GITHUB_PAT", True), ("Proxy-Authorization", True),
     ("sort_key", False), ("file_pat", False), ("bypass", False), ("compass", False),
     ("passage", False), ("author", False), ("max_tokens", False), ("api_key_env", False)],
)  # fmt: skip
def test_a_json_member_is_judged_by_the_same_name_rule(key: str, secret: bool) -> None:
    out = Redactor()({"input": {key: 12345}})["input"][key]
    assert (out == SECRET) is secret
    assert is_secret_name(key) is secret


NEAR_MISS_TEXTS = [
    "please pass the salt",
    "bypass: true",
    "compass: north by north-west",
    "passage -> the next one",
    f"keyboard{FW_COLON}qwerty",
    "<author>Jane Smith</author>",
    "<passage>kept as it is</passage>",
    "run --max-tokens 100 --passage intro",
    "token->next = NULL;",
    "docker run -u 1000:1000 image",
    "ssh -p2222 host",
    "see https://example.com:8443/path",
    "mail jane at https://example.com/@jane",
]


@pytest.mark.parametrize("text", NEAR_MISS_TEXTS)
def test_a_near_miss_keeps_its_text(text: str) -> None:
    assert through_a_message(text) == text


_NEAR_MISS_NAMES = st.sampled_from(
    ["passage", "keyboard", "max_tokens", "secretary", "author", "bypass", "compass",
     "passenger", "passport", "tokenizer", "monkey", "sort_key", "file_pat", "authority"]
)  # fmt: skip
_PLAIN = st.text(alphabet="abcdefghij ", min_size=1, max_size=30)
_FORMS = st.sampled_from(
    ["{k}: {v}", "{k}={v}", "{k} -> {v}", "{k}{FW_COLON}{v}", '"{k}": "{v}"', "<{k}>{v}</{k}>",
     "--{k} {v}", "{k}: {LDQ}{v}{RDQ}", "{k} = '''{v}'''", "{k}: |\n  {v}\nnext: 1", "{K}={v}"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(_NEAR_MISS_NAMES, _PLAIN, _FORMS)
def test_a_near_miss_name_keeps_its_value_in_every_form(key: str, value: str, form: str) -> None:
    assume(value.strip() and not value.startswith(" "))
    # An upper-case constant's `_KEY` or `_PAT` is a credential: `SORT_KEY` is no near miss.
    assume(form != "{K}={v}" or key not in ("sort_key", "file_pat"))
    text = form.format(k=key, K=key.upper(), v=value, **NAMED)
    assert redact_text(text) == text
    assert through_a_message(text) == text


_SECRET_NAMES = st.sampled_from(
    ["password", "PASS", "pass", "DB_PASSWORD_1", "OPENAI_API_KEY_2", "apiKey2", "PGPASSWORD",
     "secret", "token", "client_secret", "OPENAI_KEY"]
)  # fmt: skip
_WORD = st.text(alphabet="qxz0189жé", min_size=4, max_size=8)
_SECRET_FORMS = st.sampled_from(
    ["{k}: {v}", "{k}={v}", "{k} -> {v}", "{k}{FW_COLON}{v}", '"{k}": "{v} {v}"', "<{k}>{v} {v}</{k}>",
     "--{k} {v}", "{k}: {LDQ}{v} {v}{RDQ}", "{k}: {LSQ}{v} {v}{RSQ}", "{k}: {LAQ}{v} {v}{RAQ}", "{k}: {LCB}{v} {v}{RCB}",
     '{k} = """{v}\n{v}"""', "{k} = '''{v} {v}'''", "{k}: |\n  {v}\n  {v}\nnext: 1",
     "{k}: >\n    {v}\n\n    {v}\nnext: 1"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(_SECRET_NAMES, _WORD, _SECRET_FORMS)
def test_no_part_of_a_named_value_survives_in_any_form(key: str, value: str, form: str) -> None:
    text = "before " + form.format(k=key, v=value, **NAMED) + " after"
    assert value not in through_a_message(text)
    assert value not in redact_text(text)


_ADVERSARIAL = {
    "block indicators": "password: |\n" * 80_000,
    "block indicators on one line": "password: | " * 80_000,
    "a deep block": "password: |\n" + "  x\n" * 250_000,
    "unclosed typographic quotes": f"password: {LDQ}x " * 80_000,
    "german quotes on one line": f"password: {LOW_DQ}x{LDQ} " * 70_000,
    "an unclosed triple quote": 'password = """' + "x" * 1_000_000,
    "triple quotes": 'password = """x' * 70_000,
    "unclosed tags on one line": "<password>" * 100_000,
    "unclosed tags on lines": "<password>x\n" * 80_000,
    "tag attributes": "<password " * 100_000,
    "flags": "--password " * 90_000,
    "dashes": "-a-a-a-a" * 125_000,
    "curl lines": "curl -u a:b " * 80_000,
    "mysql flags": "mysql " + "-pa " * 250_000,
    "url schemes": "a://" * 250_000,
    "url user parts": "a://b:" * 160_000,
    "a long number after a name": "API_KEY_" + "1" * 1_000_000,
    "cookie lines": "Cookie: " * 120_000,
    "authorization lines": "Authorization: X " * 60_000,
    "comparisons": "password ==" * 90_000,
    "glued password words": "password" * 125_000,
}


@pytest.mark.parametrize("text", _ADVERSARIAL.values(), ids=_ADVERSARIAL.keys())
def test_a_megabyte_of_hostile_text_is_redacted_in_linear_time(text: str) -> None:
    started = time.perf_counter()
    redact_text(text)
    # Linear: well under a second on a laptop; quadratic: hours.
    assert time.perf_counter() - started < 10
