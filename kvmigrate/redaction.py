"""Scrub personal data and secrets from recorded text: `record.content: redacted` in the
recorder, and the excerpts of `kvmigrate parity`'s offline report.

Heuristic by nature: it aims to catch the common shapes (emails, phone numbers, card
numbers that pass the Luhn check, API keys and bearer tokens, long hex or base64 secrets)
while leaving code, dates, versions and ordinary numbers readable for parity review.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from kvmigrate.named_secrets import SECRET as SECRET
from kvmigrate.named_secrets import is_secret_name, may_name_a_secret, redact_assignments
from kvmigrate.url_passwords import mask_url_passwords

EMAIL = "[EMAIL]"
PHONE = "[PHONE]"
CARD = "[CARD]"
IBAN = "[IBAN]"
USER = "[USER]"

# Word edges where `_` counts as an edge too: `\b` does not, so Markdown's `_italics_` and
# `__bold__` hid what they wrapped (`_jane@example.com_`, `__sk-...__`) from every pattern.
_START = r"(?<![^\W_])"
_END = r"(?![^\W_])"
# OpenAI-style and similar vendor keys: sk-..., sk-proj-..., rk-..., pk_live_... The whole
# run at once, possessively, and `vendor_key` finds where the key ends in it: a pattern
# for "segments, the last one long" retried from every `sk-` of `sk-sk-sk-...`, each time
# to the end of the run (quadratic in its length).
VENDOR_KEY = re.compile(_START + r"(?:sk|rk|pk)[-_][A-Za-z0-9_-]*+")
_LONG_SEGMENT = re.compile(r"[A-Za-z0-9]{16,}")
SECRET_PATTERNS = (
    re.compile(r"(?i)" + _START + r"bearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(_START + r"(?:AKIA|ASIA)[0-9A-Z]{16}" + _END),
    re.compile(_START + r"(?:ghp|gho|ghs|ghu|github_pat|xox[abprs]|glpat)[-_][A-Za-z0-9_-]{10,}"),
    # JWT: a JSON header (base64 of `{"`), a payload, and a signature (empty when unsigned).
    re.compile(_START + r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"),
    re.compile(_START + r"[0-9a-fA-F]{32,}" + _END),
)
# A whole PEM private-key block, armour included.
_PEM_KEY = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY)-----.*?(?:-----END \1-----|\Z)", re.DOTALL
)
# IBAN: country, check digits, then 11 to 30 letters and digits, in groups of 4 or not.
_IBAN = re.compile(_START + r"[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}" + _END)
# Long base64-like runs count as secrets only if they mix letters and digits: a long
# identifier in code (all letters) should stay readable.
_BASE64ISH = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{32,}={0,2}")
# From the start of a run of address characters only: retried from each `.` of
# `a.a.a...@`, each try read to the `@` (quadratic in the run's length).
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}" + _END
)
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
# A phone number may sit in `_italics_`, but digits that end an identifier (`id_5551234567`)
# or start one are not a phone number. The whole run of phone characters at once,
# possessively, and `_phone` finds where the number ends in it: a pattern that backtracked
# to its end was retried from each digit of `1.(1.(1.(...` (quadratic in the run's length).
_PHONE = re.compile(r"(?<![^\W_]|[+.-])(?<![^\W_]_)\+?\(?\d[\d \t().-]*+")
# What may not follow a number's last digit: a letter or digit, `_` and one, `.` or `-`.
_NOT_AN_END = re.compile(r"[^\W_]|_[^\W_]|[.-]")
_PHONE_MIN_CHARS = 7  # from the first digit to the last
# Prefilters: a token of 16+ secret-ish characters; a run of digits long enough to matter.
_MAYBE_SECRET = re.compile(r"[A-Za-z0-9+/_-]{16,}|(?i:bearer)")
_DIGIT_RUN = re.compile(r"\d[\d \t().-]{5,}\d")
# The same prefilters for ASCII text with bytes methods, which run at memory speed: the
# regex above retries at every letter of every word (far slower on prose), and every new
# message and answer goes through it.
_SECRET_CLASS = bytes(
    ord("s") if chr(i).isascii() and (chr(i).isalnum() or chr(i) in "+/_-") else ord(" ")
    for i in range(256)
)
_SECRET_RUN = b"s" * 16
# Digits as `d`, the other characters a digit run may hold as `p`: `_DIGIT_RUN` on these
# starts with a literal, which the regex engine skips to, not a class tried everywhere.
_RUN_CLASS = bytes(
    ord("d") if chr(i) in "0123456789" else ord("p") if chr(i) in " \t().-" else ord("x")
    for i in range(256)
)
_RUN = re.compile(rb"d[dp]{5,}d")
_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}[./-]\d{1,2}[./-]\d{2,4}")
_DOTTED_PHONE = re.compile(r"\d{3}\.\d{3}\.\d{4}")
_DIGITS_AND_DOTS = re.compile(r"[\d.]+")
_NOT_A_DIGIT = re.compile(r"\D")

# Values under these keys are structure, not content: redacting them would break replay.
STRUCTURAL_KEYS = frozenset(
    {
        "role",
        "type",
        "model",
        "id",
        "tool_call_id",
        "call_id",
        "tool_use_id",  # Anthropic's tool_call_id
        "finish_reason",
        "stop_reason",  # Anthropic's finish_reason
        "object",
        "tool_choice",
        "response_format",
        "status",
        "name",
        "detail",
        "format",
    }
)


MESSAGE_STRUCTURAL_KEYS = STRUCTURAL_KEYS - {"name"}
MEMO_MAX_CHARS = 16 * 1024 * 1024  # per generation of the memo
# Values that identify a person whatever they look like: the end-user id fields
# (Anthropic's Messages API has `metadata.user_id` for `user`).
PERSONAL_KEYS = frozenset({"user", "safety_identifier", "user_id"})


def luhn_ok(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _card(match: re.Match[str]) -> str:
    digits = _NOT_A_DIGIT.sub("", match.group())
    return CARD if luhn_ok(digits) else match.group()


def _phone(match: re.Match[str]) -> str:
    """The number in a run of phone characters (up to its last digit that may end one),
    judged by `_phone_text`; the rest of the run as it was."""
    whole, run = match.string, match.group()
    first = match.start() + next(i for i, c in enumerate(run) if c.isdecimal())
    end = match.end()
    while end - first >= _PHONE_MIN_CHARS:
        if whole[end - 1].isdecimal() and _NOT_AN_END.match(whole, end) is None:
            return _phone_text(whole[match.start() : end]) + whole[end : match.end()]
        end -= 1
    return run


def vendor_key(match: re.Match[str], mask: str = SECRET) -> str:
    """The run up to the end of its last long segment (the key), the rest as it was."""
    run = match.group()
    end = 0
    for segment in _LONG_SEGMENT.finditer(run, 3):
        end = segment.end()
    return mask + run[end:] if end else run


def _phone_text(text: str) -> str:
    text = text.strip()
    digits = sum(map(str.isdigit, text))
    if text.isdigit():
        # A bare run of digits is a number (an id, an amount) unless it is as long as a
        # full national or international number.
        return PHONE if 10 <= digits <= 15 else text
    if not 7 <= digits <= 15 or _DATE.fullmatch(text):
        return text
    if _DIGITS_AND_DOTS.fullmatch(text):
        # Dots alone: versions and IP addresses, except the 415.555.0132 shape.
        return PHONE if _DOTTED_PHONE.fullmatch(text) else text
    return PHONE


def _iban(match: re.Match[str]) -> str:
    """An IBAN only if its mod-97 check holds (ISO 13616): a product code stays."""
    text = match.group().replace(" ", "")
    rearranged = text[4:] + text[:4]
    digits = "".join(str(int(c, 36)) for c in rearranged)
    return IBAN if 15 <= len(text) <= 34 and int(digits) % 97 == 1 else match.group()


def _base64ish(match: re.Match[str]) -> str:
    text = match.group()
    has_digit = any(c.isdigit() for c in text)
    has_alpha = any(c.isalpha() for c in text)
    return SECRET if has_digit and has_alpha else text


def _maybe_secret_or_digits(text: str) -> tuple[bool, bool, bool]:
    """(a secret pattern may match, a digit run may, a card number may): the prefilters,
    exact for ASCII."""
    if not text.isascii():  # `\d` and case folding are Unicode-aware: the regexes decide
        digits = _DIGIT_RUN.search(text) is not None
        return _MAYBE_SECRET.search(text) is not None, digits, digits
    raw = text.encode("ascii")
    secret = _SECRET_RUN in raw.translate(_SECRET_CLASS) or b"bearer" in raw.lower()
    runs = raw.translate(_RUN_CLASS)
    digits = _RUN.search(runs) is not None
    return secret, digits, digits and runs.count(b"d") >= _CARD_DIGITS  # 13 in a card


_CARD_DIGITS = 13


def _named_secrets(text: str) -> str:
    """Secrets known by their surroundings, not their shape: PEM blocks, `password: x`,
    a URL's password."""
    if "-----BEGIN" in text:
        text = _PEM_KEY.sub(SECRET, text)
    if may_name_a_secret(text):
        text = redact_assignments(text)
    if "://" in text:
        text = mask_url_passwords(text, SECRET)
    return text


def redact_text(text: str) -> str:
    # Cheap guards first: most prose has no '@', no long token and no digit run, and the
    # regex passes are the recorder's main cost.
    # Substitutions only ever remove digits and letters, so the prefilters read the input.
    maybe_secret, maybe_digits, maybe_card = _maybe_secret_or_digits(text)
    text = _named_secrets(text)
    if maybe_digits:
        text = _IBAN.sub(_iban, text)
    if maybe_secret:
        text = VENDOR_KEY.sub(vendor_key, text)
        for pattern in SECRET_PATTERNS:
            text = pattern.sub(SECRET, text)
        text = _BASE64ISH.sub(_base64ish, text)
    if "@" in text:
        text = _EMAIL.sub(EMAIL, text)
    if maybe_card:
        text = _CARD.sub(_card, text)
    if maybe_digits:
        text = _PHONE.sub(_phone, text)
    return text


class Redactor:
    """`redact` with a memo of recent strings. An agent resends its whole history every
    turn, so most strings of a request were already scrubbed on an earlier turn: its last
    answer comes back as the next turn's assistant message.

    Two generations of `capacity` strings each: when the newer fills, it becomes the older
    and the oldest go. Clearing everything at once (as before) forgot the answer scrubbed
    just before the clear, exactly when its next turn was about to resend it."""

    def __init__(self, capacity: int = 4096, max_chars: int = MEMO_MAX_CHARS) -> None:
        self.capacity = capacity
        # Bounds each generation by size too: 4,096 strings of a 30 MB paste each would
        # otherwise stay in memory, twice.
        self.max_chars = max_chars
        self._chars = 0
        self._memo: dict[str, str] = {}
        self._older: dict[str, str] = {}
        # Whether each member name seen names a secret: a history repeats a few names.
        self._secret_names: dict[str, bool] = {}

    def text(self, text: str) -> str:
        if len(text) < 6:
            return text
        done = self._memo.get(text)
        if done is None:
            done = self._older.get(text)
            if done is None:
                done = redact_text(text)
            self._remember(text, done)
        return done

    def _remember(self, text: str, done: str) -> None:
        if len(text) > self.max_chars // 4:
            return  # too large to be worth keeping
        if len(self._memo) >= self.capacity or self._chars >= self.max_chars:
            self._older, self._memo, self._chars = self._memo, {}, 0
        self._memo[text] = done
        self._chars += len(text) + len(done)

    def __call__(self, value: Any, key: str | None = None) -> Any:
        """A copy of a JSON value with every string scrubbed, except structural fields."""
        if key is not None and value is not None:
            secret = self._secret_names.get(key)
            if secret or (secret is None and self._names_secret(key)):
                return SECRET
        if isinstance(value, str):
            if key in PERSONAL_KEYS:
                return USER
            return value if key in STRUCTURAL_KEYS else self.text(value)
        if isinstance(value, dict):
            return self._object(value)
        if isinstance(value, list):
            return [self(item, key) for item in value]
        return value

    def _object(self, value: dict[str, Any]) -> dict[str, Any]:
        # String members inline: most of a chat history is {"role": ..., "content": str},
        # and a call per member was most of the walk's cost.
        out: dict[str, Any] = {}
        text, memo = self.text, self._memo  # a hit here, a miss and the rest in `text`
        # A function's `name` is structure; a message's `name` is a participant's name.
        structural = MESSAGE_STRUCTURAL_KEYS if "role" in value else STRUCTURAL_KEYS
        names = self._secret_names
        for k, v in value.items():
            secret = names.get(k)
            if secret is None:
                secret = self._names_secret(k)
            if secret and v is not None and not (k == "token" and "logprob" in value):
                # Whatever its type: `"password": 1234`, `"credentials": {...}`. Not a
                # logprobs entry's `token`, a piece of the answer.
                out[k] = SECRET
            elif type(v) is str:
                if k in PERSONAL_KEYS:
                    out[k] = USER
                elif k in structural or len(v) < 6:
                    out[k] = v
                else:
                    done = memo.get(v)
                    if done is None:
                        done = self._arguments(v) if k == "arguments" else text(v)
                    out[k] = done
            elif type(v) is dict:
                out[k] = self._object(v)
            elif v is None or type(v) in _SCALARS:
                out[k] = v
            else:
                out[k] = self(v, k)
        return out

    def _names_secret(self, key: str) -> bool:
        known = self._secret_names.get(key)
        if known is None:
            known = is_secret_name(key)
            if len(self._secret_names) < _NAMES_KEPT:  # names are the client's to choose
                self._secret_names[key] = known
        return known

    def _arguments(self, text: str) -> str:
        """A function call's arguments, a JSON object in a string: scrubbed as an object,
        so that a member naming a secret goes whole whatever its value (a number, a nested
        object), when it may have one; as text otherwise, or when it is not JSON."""
        if not may_name_a_secret(text) or (done := self._older.get(text)) is not None:
            return self.text(text)
        try:
            parsed = orjson.loads(text)
            if isinstance(parsed, dict):
                done = orjson.dumps(self._object(parsed)).decode()
                self._remember(text, done)
                return done
        except (orjson.JSONDecodeError, orjson.JSONEncodeError, RecursionError):
            pass  # not JSON, or nested deeper than orjson writes: the text rules still apply
        return self.text(text)


_SCALARS = frozenset({int, float, bool})
_NAMES_KEPT = 4096


def redact(value: Any, key: str | None = None) -> Any:
    """A copy of a JSON value with every string scrubbed, except structural fields."""
    return Redactor(capacity=0)(value, key)
