"""JavaScript/TypeScript clients: `new OpenAI({ baseURL })`, the Vercel AI SDK's
`createOpenAI({ baseURL })` and LangChain JS `configuration: { baseURL }`; Anthropic's
`new Anthropic({ baseURL })` and LangChain's `ChatAnthropic({ anthropicApiUrl })`, whose
URL is the proxy's root (the SDK appends `/v1/messages`), and the Vercel AI SDK's
`createAnthropic({ baseURL })`, whose URL ends in `/v1` like OpenAI's.

Token-based: only a string literal in the URL property of a recognised client's options
object is ever edited; everything else, a template with `${}` included, is reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvmigrate.migrate.findings import Action, Edit, Finding, ParseFailure, ScanResult
from kvmigrate.migrate.js_tokens import Tok, Token, TokenizeError, tokenize
from kvmigrate.migrate.text import LineIndex
from kvmigrate.migrate.values import RewriteOptions, Verdict, is_azure_url, judge_url

_URL_PROPS = frozenset({"baseURL", "basePath"})


@dataclass(frozen=True, slots=True)
class _Client:
    framework: str
    url_role: str  # "options": the URL is a top-level option; "configuration": nested there
    flag: str | None = None
    env_var: str = "OPENAI_BASE_URL"  # what the client reads when no URL is given
    root: bool = False  # its URL is the proxy's root, without `/v1` (Anthropic's SDK)
    url_props: frozenset[str] = _URL_PROPS


_OPENAI = _Client("openai", "options")
_VERCEL = _Client("vercel-ai", "options")
_LANGCHAIN = _Client("langchain-js", "configuration")
_ANTHROPIC = _Client("anthropic", "options", env_var="ANTHROPIC_BASE_URL", root=True)
_LANGCHAIN_ANTHROPIC = _Client(
    "langchain-js", "options", env_var="ANTHROPIC_BASE_URL", root=True,
    url_props=frozenset({"anthropicApiUrl"}),
)  # fmt: skip
# Its default is https://api.anthropic.com/v1, and it reads ANTHROPIC_BASE_URL the same way.
_VERCEL_ANTHROPIC = _Client("vercel-ai", "options", env_var="ANTHROPIC_BASE_URL")
_ANTHROPIC_CLOUD = (
    "Anthropic's Bedrock and Vertex clients sign requests for AWS or Google Cloud: replace "
    "with new Anthropic({ baseURL: <proxy root> }) and serve the model from a kvmigrate backend"
)
# What to write instead of a client the proxy cannot move, in the file's own language: the
# Python wording (`OpenAI(base_url=<proxy>)`) read as a typo in a .ts file. Each names the
# same package's OpenAI-compatible client, so the import stays the one the file has.
_INSTEAD = {
    "openai": "new OpenAI({ baseURL: <proxy> })",
    "vercel-ai": 'createOpenAI({ baseURL: <proxy> }) from "@ai-sdk/openai"',
    "langchain-js": "new ChatOpenAI({ configuration: { baseURL: <proxy> } })",
}
_AZURE_JS = (
    "Azure OpenAI clients ignore OPENAI_BASE_URL and build deployment URLs: replace with {} "
    "and map the deployment to a model in the kvmigrate config"
)
_BEDROCK_JS = (
    "Bedrock does not speak the OpenAI API: call the proxy with {} and serve the model from "
    "a kvmigrate backend instead"
)
# (module, exported name) -> client; "default" is the default export.
_CLIENTS: Mapping[tuple[str, str], _Client] = MappingProxyType(
    {
        ("openai", "default"): _OPENAI,
        ("openai", "OpenAI"): _OPENAI,
        ("openai", "AzureOpenAI"): _Client(
            "azure", "options", _AZURE_JS.format(_INSTEAD["openai"])
        ),
        ("@ai-sdk/openai", "createOpenAI"): _VERCEL,
        ("@ai-sdk/openai-compatible", "createOpenAICompatible"): _VERCEL,
        ("@ai-sdk/azure", "createAzure"): _Client(
            "azure", "options", _AZURE_JS.format(_INSTEAD["vercel-ai"])
        ),
        ("@ai-sdk/amazon-bedrock", "createAmazonBedrock"): _Client(
            "bedrock", "", _BEDROCK_JS.format(_INSTEAD["vercel-ai"])
        ),
        ("@langchain/openai", "ChatOpenAI"): _LANGCHAIN,
        ("@langchain/openai", "OpenAI"): _LANGCHAIN,
        ("@langchain/openai", "OpenAIEmbeddings"): _LANGCHAIN,
        ("@langchain/openai", "AzureChatOpenAI"): _Client(
            "azure", "", _AZURE_JS.format(_INSTEAD["langchain-js"])
        ),
        ("@anthropic-ai/sdk", "default"): _ANTHROPIC,
        ("@anthropic-ai/sdk", "Anthropic"): _ANTHROPIC,
        ("@anthropic-ai/bedrock-sdk", "default"): _Client("bedrock", "", _ANTHROPIC_CLOUD),
        ("@anthropic-ai/bedrock-sdk", "AnthropicBedrock"): _Client("bedrock", "", _ANTHROPIC_CLOUD),
        ("@anthropic-ai/vertex-sdk", "default"): _Client("vertex", "", _ANTHROPIC_CLOUD),
        ("@anthropic-ai/vertex-sdk", "AnthropicVertex"): _Client("vertex", "", _ANTHROPIC_CLOUD),
        ("@ai-sdk/anthropic", "createAnthropic"): _VERCEL_ANTHROPIC,
        ("@langchain/anthropic", "ChatAnthropic"): _LANGCHAIN_ANTHROPIC,
    }
)
# When a name is not imported in this file (a global, or a re-export), go by the name alone.
_BY_NAME: Mapping[str, _Client] = MappingProxyType(
    {
        "OpenAI": _OPENAI,
        "createOpenAI": _VERCEL,
        "ChatOpenAI": _LANGCHAIN,
        "Anthropic": _ANTHROPIC,
        "createAnthropic": _VERCEL_ANTHROPIC,
        "ChatAnthropic": _LANGCHAIN_ANTHROPIC,
    }
)


@dataclass(slots=True)
class _Frame:
    opener: str  # ( { [
    client: _Client | None = None
    role: str = ""  # for `{`: "options" or "configuration"; for `(`: "call"
    at: int = 0  # token index of the callee, for findings
    saw_url: bool = False
    saw_spread: bool = False
    parent: _Frame | None = None  # configuration -> its options object


def scan_js(text: str, rel: str, options: RewriteOptions) -> ScanResult:
    try:
        tokens = tokenize(text)
    except TokenizeError as exc:
        raise ParseFailure(f"JS tokenizer: {exc}") from None
    scanner = _Scanner(text, rel, tokens, options)
    scanner.run()
    return scanner.result


def _imports(tokens: list[Token]) -> dict[str, tuple[str, str]]:
    """local name -> (module, exported name), from `import ... from "m"` and `require("m")`."""
    names: dict[str, tuple[str, str]] = {}
    for i, tok in enumerate(tokens):
        if tok.text == "import" and tok.kind is Tok.IDENT:
            j = i + 1
            while j < len(tokens) and tokens[j].text != "from" and tokens[j].text != ";":
                j += 1
            if j + 1 < len(tokens) and tokens[j + 1].kind is Tok.STRING:
                _bind(names, tokens[i + 1 : j], tokens[j + 1].text[1:-1])
        elif tok.text == "require" and i + 2 < len(tokens) and tokens[i + 2].kind is Tok.STRING:
            k = i - 1  # const X = require("m") or const { A, B } = require("m")
            while k > 0 and tokens[k].text not in ("const", "let", "var", ";"):
                k -= 1
            _bind(names, tokens[k + 1 : i - 1], tokens[i + 2].text[1:-1])
    return names


def _bind(names: dict[str, tuple[str, str]], clause: list[Token], module: str) -> None:
    in_braces = False
    pending: str | None = None
    for tok in clause:
        if tok.text in ("{", "}"):
            in_braces = tok.text == "{"
        elif tok.kind is Tok.IDENT and tok.text not in ("type", "as", "*"):
            if pending is not None:  # `{ OpenAI as Client }` / `{ OpenAI: Client }`
                names[tok.text] = (module, pending)
                pending = None
            else:
                names[tok.text] = (module, tok.text if in_braces else "default")
        elif tok.text in ("as", ":") and in_braces and names:
            pending = names.popitem()[1][1]


class _Scanner:
    def __init__(self, text: str, rel: str, tokens: list[Token], options: RewriteOptions):
        self.result = ScanResult()
        self._text = text
        self._rel = rel
        self._tokens = tokens
        self._options = options
        self._imports = _imports(tokens)
        self._lines = LineIndex(text)
        self._stack: list[_Frame] = []

    def run(self) -> None:
        for i, tok in enumerate(self._tokens):
            if tok.kind is not Tok.PUNCT and tok.kind is not Tok.IDENT:
                if tok.kind is Tok.STRING:
                    self._property(i)
                continue
            if tok.text in ("(", "[", "{"):
                self._open(i, tok.text)
            elif tok.text in (")", "]", "}") and self._stack:
                self._close(self._stack.pop())
            elif tok.text == "..." and self._stack:
                self._stack[-1].saw_spread = True
            elif tok.kind is Tok.IDENT:
                self._property(i)

    def _open(self, i: int, opener: str) -> None:
        prev = self._tokens[i - 1] if i else None
        top = self._stack[-1] if self._stack else None
        frame = _Frame(opener)
        if opener == "(" and prev is not None and prev.kind is Tok.IDENT:
            client = self._client(prev.text)
            if client is not None:
                frame = _Frame("(", client, "call", i - 1)
        elif opener == "{" and top is not None and top.client is not None:
            if top.role == "call" and prev is not None and prev.text == "(":
                top.saw_url = True  # an options object: it decides, not the call
                frame = _Frame("{", top.client, "options", top.at)
            elif top.role == "options" and self._key_before(i) == "configuration":
                frame = _Frame("{", top.client, "configuration", top.at, parent=top)
        self._stack.append(frame)

    def _close(self, frame: _Frame) -> None:
        if frame.client is None or frame.role == "configuration":
            return
        client = frame.client
        if client.flag is not None:
            if frame.role == "call":
                self._add(frame.at, client.framework, Action.FLAGGED, "not rewritten", client.flag)
            return
        if frame.role == "call" and not frame.saw_url:
            args = self._text[self._tokens[frame.at + 1].end : self._closing_start(frame)]
            if args.strip(" \t\r\n()"):
                self._human(frame.at, client, f"options passed as {args.strip(' ()')!r}")
            else:
                self._switch(frame.at, client)
        elif frame.role == "options" and not frame.saw_url:
            if frame.saw_spread:
                self._human(frame.at, client, "options spread from elsewhere may set the URL")
            else:
                self._switch(frame.at, client)

    def _closing_start(self, frame: _Frame) -> int:
        # The call's closing paren is the token just handled; find it from the callee on.
        depth = 0
        for tok in self._tokens[frame.at + 1 :]:
            depth += {"(": 1, ")": -1}.get(tok.text, 0)
            if depth == 0:
                return tok.start
        return len(self._text)

    def _client(self, name: str) -> _Client | None:
        imported = self._imports.get(name)
        if imported is not None:
            return _CLIENTS.get(imported)
        return _BY_NAME.get(name)

    def _key_before(self, i: int) -> str:
        """For `key: {` at token i, the key (unquoted); else ''."""
        if i >= 2 and self._tokens[i - 1].text == ":":
            return self._tokens[i - 2].text.strip("'\"")
        return ""

    def _property(self, i: int) -> None:
        top = self._stack[-1] if self._stack else None
        tok = self._tokens[i]
        if top is None or top.client is None or top.client.flag or top.opener != "{":
            return
        if tok.text.strip("'\"") not in top.client.url_props or top.role != top.client.url_role:
            return
        if i == 0 or self._tokens[i - 1].text not in ("{", ","):
            return
        nxt = self._tokens[i + 1] if i + 1 < len(self._tokens) else None
        if nxt is None or nxt.text not in (":", ",", "}"):
            return  # a method or something else, not a property
        top.saw_url = True
        if top.parent is not None:
            top.parent.saw_url = True
        if nxt.text != ":":
            self._human(i, top.client, f"{tok.text} shorthand takes a variable")
            return
        self._value(i, self._value_tokens(i + 2), top.client)

    def _value_tokens(self, start: int) -> list[Token]:
        depth = 0
        out: list[Token] = []
        for tok in self._tokens[start:]:
            if depth == 0 and tok.text in (",", "}", ")"):
                break
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(tok.text, 0)
            out.append(tok)
        return out

    def _value(self, at: int, value: list[Token], client: _Client) -> None:
        prop = self._tokens[at].text.strip("'\"")
        code = self._text[value[0].start : value[-1].end] if value else ""
        literal = len(value) == 1 and value[0].kind in (Tok.STRING, Tok.TEMPLATE)
        if literal and "${" not in code and "\\" not in code:
            self._literal(at, value[0], client, prop)
            return
        words = [t.text for t in value]
        # process.env.X (Node) and import.meta.env.X (Vite) are already switchable.
        if len(words) in (5, 7) and words[-5] in ("process", "meta") and words[-4:-1] == [
            ".", "env", ".",
        ]:  # fmt: skip
            var = words[-1]
            msg = f"{prop} reads {var}; set {var}={self._url(client)} where it runs"
            self._add(at, client.framework, Action.ENV_SWITCH, msg)
            return
        self._human(at, client, f"{prop}: URL built at run time ({code})")

    def _literal(self, at: int, tok: Token, client: _Client, prop: str) -> None:
        old = tok.text[1:-1]
        proxy = self._url(client)
        verdict = judge_url(old, proxy)
        if verdict is Verdict.SAME:
            return
        if verdict is not Verdict.REWRITE:
            self._human(at, client, f"{prop}: {old!r} is not a URL")
            return
        if is_azure_url(old):
            msg = f"{prop}: {old!r} is Azure OpenAI: not rewritten"
            instead = _INSTEAD.get(client.framework, _INSTEAD["openai"])
            self._add(at, client.framework, Action.FLAGGED, msg, _AZURE_JS.format(instead), old)
            return
        quote = tok.text[0]
        self.result.edits.append(Edit(tok.start, tok.end, f"{quote}{proxy}{quote}"))
        msg = f"{prop}: {old!r} -> proxy"
        self._add(at, client.framework, Action.REWRITE, msg, proxy, old)

    def _url(self, client: _Client) -> str:
        return self._options.anthropic_url if client.root else self._options.proxy_url

    def _switch(self, at: int, client: _Client) -> None:
        msg = f"{self._tokens[at].text}() sets no baseURL, so {client.env_var} is the switch"
        if client is _VERCEL_ANTHROPIC:
            msg += f" (createAnthropic wants it with /v1: {self._options.proxy_url})"
        self._add(at, client.framework, Action.ENV_SWITCH, msg)

    def _human(self, at: int, client: _Client, message: str) -> None:
        self._add(at, client.framework, Action.NEEDS_HUMAN, message)

    def _add(
        self, at: int, framework: str, action: Action, message: str,
        new: str | None = None, old: str | None = None,
    ) -> None:  # fmt: skip
        line = self._lines.line(self._tokens[at].start)
        self.result.findings.append(
            Finding(self._rel, line, "js", framework, action, message, old, new)
        )
