"""Python client code: find where LLM clients get their base URL, and rewrite literal ones.

libcst parses the file; edits are spliced into the original text at the byte spans libcst
records, so comments, formatting and everything else stay byte-identical.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ByteSpanPositionProvider, MetadataWrapper, PositionProvider

from kvmigrate.migrate.findings import Action, Edit, Finding, ParseFailure, ScanResult
from kvmigrate.migrate.providers import UNSERVED_FLAG, Route, provider_of, route
from kvmigrate.migrate.python_rules import (
    AZURE,
    BEDROCK,
    CALL_RULES,
    CONFIG_LIST_URL_KEYS,
    MODULE_URL_ATTRS,
    WRAPPERS,
    CallRule,
)
from kvmigrate.migrate.values import (
    ANTHROPIC_URL_VARS,
    KEY_VARS,
    URL_VARS,
    RewriteOptions,
    Verdict,
    is_azure_url,
    judge_url,
)

_ENV_READERS = frozenset({"os.getenv", "os.environ.get"})
_MAX_BRACKET_DEPTH = 200
# Keyword arguments (and module attributes) that carry an API key.
_KEY_KWARGS = frozenset({"api_key", "openai_api_key", "anthropic_api_key"})
# What each provider a URL change cannot move is told instead (the proposed change).
_FLAGGED_ROUTES = {
    Route.AZURE: AZURE.flag or "",
    Route.BEDROCK: BEDROCK.flag or "",
    Route.UNSERVED: UNSERVED_FLAG,
}


def scan_python(text: str, rel: str, options: RewriteOptions) -> ScanResult:
    # libcst's native parser overflows the C stack (a segfault that loses the whole report)
    # on brackets nested a few thousand deep; CPython itself refuses more than 200.
    depth = _bracket_depth(text)
    if depth > _MAX_BRACKET_DEPTH:
        raise ParseFailure(f"brackets nested {depth} deep (Python allows {_MAX_BRACKET_DEPTH})")
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise ParseFailure(f"Python syntax error: {exc.message} (line {exc.raw_line})") from None
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    imports = _Imports()
    module.visit(imports)
    scanner = _Scanner(rel, text, module, imports.names, options)
    wrapper.visit(scanner)
    return scanner.result


def _bracket_depth(text: str) -> int:
    """The deepest bracket nesting, counted roughly (brackets in strings count too): a
    cheap guard, run before any parser sees the text."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(depth - 1, 0)
    return deepest


class _Imports(cst.CSTVisitor):
    """Local name -> dotted name it was imported as, from every import in the module."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            dotted = _dotted(alias.name)
            if alias.asname and isinstance(alias.asname.name, cst.Name):
                self.names[alias.asname.name.value] = dotted
            else:
                head = dotted.split(".")[0]
                self.names[head] = head

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = _dotted(node.module)
        for alias in node.names:
            name = _dotted(alias.name)
            local = name
            if alias.asname and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.names[local] = f"{module}.{name}"


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def _string_key(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


class _Scanner(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider, ByteSpanPositionProvider)

    def __init__(
        self,
        rel: str,
        text: str,
        module: cst.Module,
        imports: dict[str, str],
        options: RewriteOptions,
    ) -> None:
        self.result = ScanResult()
        self._rel = rel
        self._text = text
        self._encoded = text.encode("utf-8")
        self._module = module
        self._imports = imports
        self._options = options
        self._wrappers: list[tuple[cst.Call, str]] = []
        self._uses_instructor = any(v.split(".")[0] == "instructor" for v in imports.values())

    # --- visiting -------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        qualified = self._qualify(node.func)
        key = _rule_key(qualified)
        if key is not None and key in WRAPPERS:
            self._wrappers.append((node, WRAPPERS[key]))
        rule = CALL_RULES.get(key) if key is not None else None
        if rule is not None:
            self._client_call(node, rule)
        elif self._is_bedrock_client(node):
            self._flag(node, BEDROCK, "boto3 bedrock client")
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "config_list":
                self._config_list(arg.value)

    def leave_Call(self, original_node: cst.Call) -> None:
        if self._wrappers and self._wrappers[-1][0] is original_node:
            self._wrappers.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            t = target.target
            if isinstance(t, cst.Attribute) and t.attr.value in _KEY_KWARGS:
                self._secret(node.value)  # `openai.api_key = "sk-..."`
            elif isinstance(t, cst.Subscript) and _string_key(_subscript_index(t)) in KEY_VARS:
                self._secret(node.value)
            if isinstance(t, cst.Attribute) and t.attr.value in MODULE_URL_ATTRS:
                if self._qualify(t.value) == "openai":
                    self._url_value(node.value, "openai", f"openai.{t.attr.value}")
            elif isinstance(t, cst.Subscript) and self._qualify(t.value) == "os.environ":
                var = _string_key(_subscript_index(t))
                if var in URL_VARS:
                    proxy = self._options.url_for(var)
                    self._url_value(node.value, "os.environ", f"os.environ[{var!r}]", proxy)
            elif isinstance(t, cst.Name) and "config_list" in t.value.lower():
                self._config_list(node.value)

    def visit_DictElement(self, node: cst.DictElement) -> None:
        if _string_key(node.key) == "config_list":
            self._config_list(node.value)

    # --- clients --------------------------------------------------------------------------

    def _client_call(self, node: cst.Call, rule: CallRule) -> None:
        callee = self._module.code_for_node(node.func)
        for arg in node.args:
            if arg.keyword and arg.keyword.value in _KEY_KWARGS:
                self._secret(arg.value)
        framework = rule.framework
        if framework == "openai" and (self._wrappers or self._uses_instructor):
            framework = self._wrappers[-1][1] if self._wrappers else "instructor"
        if rule.flag is not None:
            self._flag(node, rule, f"{callee}()")
            return
        provider = self._model_provider(node) if rule.prefixed else ""
        where = route(provider)
        if where in _FLAGGED_ROUTES:
            label = f"{callee}({provider}/...)"
            self._add(node, framework, Action.FLAGGED, f"{label}: not rewritten",
                      new=_FLAGGED_ROUTES[where].format(provider=provider))  # fmt: skip
            return
        url_args = [a for a in node.args if a.keyword and a.keyword.value in rule.url_kwargs]
        anthropic = where is Route.ANTHROPIC
        proxy = self._options.anthropic_url if anthropic else self._options.url_for(rule.env_var)
        for arg in url_args:
            assert arg.keyword is not None
            self._url_value(arg.value, framework, f"{callee}({arg.keyword.value}=...)", proxy)
        if url_args:
            return
        if any(arg.star == "**" for arg in node.args):
            self._add(node, framework, Action.NEEDS_HUMAN, f"{callee}(**...) may set its URL")
            return
        self._add(
            node,
            framework,
            Action.ENV_SWITCH,
            f"{callee}() sets no base URL, so {rule.env_var} is the switch "
            f"(unset, it goes to {_default_host(rule.env_var)})",
        )

    def _secret(self, expr: cst.BaseExpression) -> None:
        """A literal key in the code: a diff shown in a terminal or a CI log masks it."""
        key = _string_key(expr)
        if key:
            self.result.secrets.add(key)

    def _flag(self, node: cst.Call, rule: CallRule, label: str) -> None:
        assert rule.flag is not None
        self._add(node, rule.framework, Action.FLAGGED, f"{label}: not rewritten", new=rule.flag)

    def _model_provider(self, node: cst.Call) -> str:
        """The `provider/` prefix of the model: keyword `model`, else the first positional."""
        positional = [a for a in node.args if a.keyword is None and not a.star]
        model = next((a for a in node.args if a.keyword and a.keyword.value == "model"), None)
        chosen = model or (positional[0] if positional else None)
        return provider_of(_string_key(chosen.value) or "") if chosen else ""

    def _is_bedrock_client(self, node: cst.Call) -> bool:
        if not (isinstance(node.func, cst.Attribute) and node.func.attr.value == "client"):
            return False
        for arg in node.args:
            if arg.keyword is None or arg.keyword.value == "service_name":
                return (_string_key(arg.value) or "").startswith("bedrock")
        return False

    def _config_list(self, expr: cst.BaseExpression) -> None:
        """AutoGen: each dict in a config_list may carry base_url."""
        if not isinstance(expr, cst.List):
            return
        for element in expr.elements:
            entry = element.value
            if not isinstance(entry, cst.Dict):
                continue
            fields = {
                _string_key(e.key): e for e in entry.elements if isinstance(e, cst.DictElement)
            }
            if _string_key(fields["api_type"].value if "api_type" in fields else None) == "azure":
                msg = "config_list entry with api_type azure: not rewritten"
                self._add(entry, "autogen", Action.FLAGGED, msg, new=AZURE.flag)
                continue
            urls = [fields[k] for k in CONFIG_LIST_URL_KEYS if k in fields]
            for e in urls:
                self._url_value(e.value, "autogen", f"config_list entry {_string_key(e.key)!r}")
            if not urls and "model" in fields:
                self._add(
                    entry, "autogen", Action.ENV_SWITCH,
                    "config_list entry sets no base_url, so OPENAI_BASE_URL is the switch",
                )  # fmt: skip

    # --- values ---------------------------------------------------------------------------

    def _url_value(
        self, expr: cst.BaseExpression, framework: str, label: str, proxy: str | None = None
    ) -> None:
        """`proxy`: the URL this value should hold (the OpenAI one unless told)."""
        if isinstance(expr, cst.SimpleString) and isinstance(expr.evaluated_value, str):
            self._literal(expr, expr.evaluated_value, framework, label, proxy)
            return
        if isinstance(expr, cst.Name) and expr.value == "None":
            self._add(
                expr,
                framework,
                Action.ENV_SWITCH,
                f"{label} is None, so the environment variable decides",
            )
            return
        var = self._env_read(expr)
        if var is not None:
            self._add(
                expr, framework, Action.ENV_SWITCH,
                f"{label} reads ${var}; set {var}={proxy or self._options.url_for(var)} "
                "where it runs",
            )  # fmt: skip
            return
        code = self._module.code_for_node(expr)
        self._add(expr, framework, Action.NEEDS_HUMAN, f"{label}: URL built at run time ({code})")

    def _literal(
        self, node: cst.SimpleString, value: str, framework: str, label: str, proxy: str | None
    ) -> None:
        proxy = proxy or self._options.proxy_url
        verdict = judge_url(value, proxy)
        if verdict is Verdict.SAME:
            return
        if verdict is Verdict.REWRITE and is_azure_url(value):
            msg = f"{label}: {value!r} is Azure OpenAI: not rewritten"
            self._add(node, framework, Action.FLAGGED, msg, value, AZURE.flag)
            return
        if verdict is not Verdict.REWRITE:
            why = "a reference" if verdict is Verdict.REFERENCE else "not a URL"
            self._add(node, framework, Action.NEEDS_HUMAN, f"{label}: {value!r} is {why}", value)
            return
        quote = node.quote
        new_literal = f"{node.prefix}{quote}{proxy}{quote}"
        self.result.edits.append(self._edit(node, new_literal))
        self._add(node, framework, Action.REWRITE, f"{label}: {value!r} -> proxy", value, proxy)

    def _env_read(self, expr: cst.BaseExpression) -> str | None:
        if isinstance(expr, cst.Call) and self._qualify(expr.func) in _ENV_READERS and expr.args:
            return _string_key(expr.args[0].value)
        if isinstance(expr, cst.Subscript) and self._qualify(expr.value) == "os.environ":
            return _string_key(_subscript_index(expr))
        return None

    # --- plumbing -------------------------------------------------------------------------

    def _qualify(self, expr: cst.BaseExpression) -> str | None:
        dotted = _dotted(expr)
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        resolved = self._imports.get(head)
        if resolved is None:
            return None
        return f"{resolved}.{rest}" if rest else resolved

    def _edit(self, node: cst.CSTNode, new: str) -> Edit:
        span = self.get_metadata(ByteSpanPositionProvider, node)
        start = len(self._encoded[: span.start].decode("utf-8"))
        end = start + len(self._encoded[span.start : span.start + span.length].decode("utf-8"))
        # A coding cookie could make libcst count bytes in another encoding: never guess.
        if self._text[start:end] != self._module.code_for_node(node):
            raise ParseFailure("could not locate a literal exactly; left untouched")
        return Edit(start, end, new)

    def _add(
        self,
        node: cst.CSTNode,
        framework: str,
        action: Action,
        message: str,
        old: str | None = None,
        new: str | None = None,
    ) -> None:
        line = self.get_metadata(PositionProvider, node).start.line
        finding = Finding(self._rel, line, "python", framework, action, message, old, new)
        self.result.findings.append(finding)


def _default_host(variable: str) -> str:
    return "api.anthropic.com" if variable in ANTHROPIC_URL_VARS else "api.openai.com"


def _rule_key(qualified: str | None) -> tuple[str, str] | None:
    if not qualified:
        return None
    parts = qualified.split(".")
    return parts[0], parts[-1]


def _subscript_index(node: cst.Subscript) -> cst.BaseExpression | None:
    if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        return node.slice[0].slice.value
    return None
