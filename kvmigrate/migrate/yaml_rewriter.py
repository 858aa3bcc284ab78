"""YAML deployment files: docker-compose, Kubernetes, Helm values, GitHub Actions, LiteLLM.

ruamel.yaml composes the node graph, which records where every scalar starts and ends in
the text; the new value is spliced in at that position, in the scalar's own quoting style.
Re-serialising a round-trip tree can still reflow long lines or re-indent sequences, so we
never dump: comments, order and every byte outside the targeted values are kept by
construction, and the result is re-parsed to prove only the targeted values changed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvmigrate.migrate.findings import Action, Edit, Finding, ParseFailure, ScanResult
from kvmigrate.migrate.providers import UNSERVED_FLAG, Route, provider_of, route
from kvmigrate.migrate.python_rules import AZURE, BEDROCK
from kvmigrate.migrate.values import (
    KEY_VARS,
    URL_VARS,
    RewriteOptions,
    Verdict,
    is_azure_url,
    judge_key,
    judge_url,
)

_NULL_TAG = "tag:yaml.org,2002:null"
_PLAIN_UNSAFE = re.compile(r"[-+]?[\d._]+|true|false|yes|no|on|off|null|~|[^A-Za-z0-9].*", re.I)
_MAX_DEPTH = 64
# Deployment configs expand to thousands of nodes; past this, aliases are multiplying.
_MAX_EXPANDED = 100_000
_PROPERTY = re.compile(r"[&!]\S*\s+")
_DEPLOY_KINDS = frozenset({"docker-compose", "kubernetes", "helm", "github-actions"})
Path = tuple[int | str, ...]
# What a model_list entry whose provider a URL change cannot move is told instead.
_FLAGGED_ROUTES = {
    Route.AZURE: AZURE.flag or "",
    Route.BEDROCK: BEDROCK.flag or "",
    Route.UNSERVED: UNSERVED_FLAG,
}


@dataclass
class _Doc:
    rel: str
    text: str
    framework: str
    kind: str  # the Kubernetes kind, when there is one
    options: RewriteOptions
    result: ScanResult
    changed: dict[Path, str] = field(default_factory=dict)  # where the data changes, to what


def scan_yaml(text: str, rel: str, options: RewriteOptions) -> ScanResult:
    try:
        roots = list(YAML(typ="rt").compose_all(text))
    except YAMLError as exc:
        raise ParseFailure(f"YAML error: {_one_line(exc)}") from None
    expanded = _expanded_size(roots)
    if expanded > _MAX_EXPANDED:
        raise ParseFailure(f"YAML aliases expand to more than {_MAX_EXPANDED} nodes (an alias "
                           "bomb?): not scanned; check this file by hand")  # fmt: skip
    result = ScanResult()
    changed: dict[Path, str] = {}
    for index, root in enumerate(roots):
        if root is None:
            continue
        framework, kind = _classify(rel, root)
        if framework in _DEPLOY_KINDS and result.deploy_kind is None:
            result.deploy_kind = framework
        doc = _Doc(rel, text, framework, kind, options, result)
        _walk(doc, root, (index,), 0)
        changed.update(doc.changed)
    if result.edits:
        _verify(text, result.edits, changed)
    result.findings = list(dict.fromkeys(result.findings))  # an alias revisits its node
    return result


def _expanded_size(roots: list[Node | None]) -> int:
    """How many nodes the documents hold with every alias expanded, counted in one pass
    over the distinct nodes (an alias is the same node object, so its size is memoised):
    a few hundred bytes of nested aliases expand exponentially, and so would our walk."""
    sizes: dict[int, int] = {}
    opened: set[int] = set()
    for top in roots:
        stack: list[tuple[Node, bool]] = [(top, False)] if top is not None else []
        while stack:  # post-order without recursion: the nesting depth is the file's choice
            node, children_done = stack.pop()
            if id(node) in sizes:
                continue
            if not children_done and id(node) in opened:
                return _MAX_EXPANDED + 1  # an alias inside its own anchor: endless
            opened.add(id(node))
            kids = _children(node)
            if children_done or not kids:
                sizes[id(node)] = min(_MAX_EXPANDED + 1, 1 + sum(sizes[id(k)] for k in kids))
            else:
                stack.append((node, True))
                stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sum(sizes[id(top)] for top in roots if top is not None)


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _classify(rel: str, root: Node) -> tuple[str, str]:
    keys = {k.value: v for k, v in _pairs(root)} if isinstance(root, MappingNode) else {}
    name = rel.rsplit("/", 1)[-1]
    if ".github/workflows/" in f"/{rel}":
        return "github-actions", ""
    if "apiVersion" in keys and "kind" in keys:
        kind = keys["kind"]
        return "kubernetes", kind.value if isinstance(kind, ScalarNode) else ""
    if "services" in keys:
        return "docker-compose", ""
    if "model_list" in keys:
        return "litellm", ""
    if name.startswith("values") or "/charts/" in f"/{rel}":
        return "helm", ""
    return "yaml", ""


def _pairs(node: MappingNode) -> Iterator[tuple[ScalarNode, Node]]:
    for key, value in node.value:
        if isinstance(key, ScalarNode):
            yield key, value


def _walk(doc: _Doc, node: Node, path: Path, depth: int) -> None:
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, MappingNode):
        _mapping(doc, node, path)
        for key, value in _pairs(node):
            # `<<: *anchor` merges keys into this mapping, so they live at this path.
            _walk(doc, value, path if key.value == "<<" else (*path, key.value), depth + 1)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            if isinstance(item, ScalarNode):
                _list_item(doc, item, (*path, index))
            else:
                _walk(doc, item, path if path[-1] == "<<" else (*path, index), depth + 1)


def _mapping(doc: _Doc, node: MappingNode, path: Path) -> None:
    fields = {k.value: v for k, v in _pairs(node)}
    name = fields.get("name")
    value = fields.get("value")
    if isinstance(name, ScalarNode) and name.value in KEY_VARS and isinstance(value, ScalarNode):
        doc.result.secrets.add(str(value.value))  # `- name: OPENAI_API_KEY` + `value: sk-...`
    if isinstance(name, ScalarNode) and _wanted(name.value, doc.options):
        # Kubernetes container env: `- name: OPENAI_BASE_URL` + `value:` or `valueFrom:`.
        if isinstance(fields.get("value"), ScalarNode):
            _scalar(doc, name.value, fields["value"], (*path, "value"))
        elif "valueFrom" in fields:
            _add(doc, name, Action.NEEDS_HUMAN, f"{name.value} comes from valueFrom: "
                 "set it to the proxy in the referenced ConfigMap or Secret")  # fmt: skip
    for key, value in _pairs(node):
        if key.value in KEY_VARS and isinstance(value, ScalarNode):
            doc.result.secrets.add(str(value.value))  # masked even in diff context lines
        if _wanted(key.value, doc.options) and isinstance(value, ScalarNode):
            if doc.kind == "Secret" and path[1:] == ("data",):
                _add(doc, key, Action.NEEDS_HUMAN, f"{key.value} in Secret data is base64")
            else:
                _scalar(doc, key.value, value, (*path, key.value))
    if path[1:2] == ("model_list",) and path[3:] == ("litellm_params",):
        _litellm_params(doc, node, fields, path)


def _litellm_params(doc: _Doc, node: MappingNode, fields: dict[str, Node], path: Path) -> None:
    model = fields.get("model")
    name = str(model.value) if isinstance(model, ScalarNode) else ""
    provider = provider_of(name)
    where = route(provider)
    if where in _FLAGGED_ROUTES:
        _add(doc, node, Action.FLAGGED, f"model_list entry for {name or '?'}: not rewritten",
             new=_FLAGGED_ROUTES[where].format(provider=provider))  # fmt: skip
        return
    urls = [k for k in ("api_base", "base_url") if isinstance(fields.get(k), ScalarNode)]
    # LiteLLM's anthropic/ models take the API's root, as Anthropic's SDK does.
    root = doc.options.anthropic_url if where is Route.ANTHROPIC else None
    for key in urls:
        _scalar(doc, f"litellm_params.{key}", fields[key], (*path, key), url=True, proxy=root)
    if not urls and where is Route.OPENAI:
        _add(doc, node, Action.ENV_SWITCH, "model_list entry sets no api_base, so "
             "OPENAI_API_BASE is the switch")  # fmt: skip


def _list_item(doc: _Doc, item: ScalarNode, path: Path) -> None:
    """docker-compose `environment:` in list form: `- OPENAI_BASE_URL=https://...`."""
    var, eq, value = str(item.value).partition("=")
    if eq and var in KEY_VARS:
        doc.result.secrets.add(value)
    if eq and _wanted(var, doc.options):
        _scalar(doc, var, item, path, prefix=f"{var}=", value=value)


def _scalar(
    doc: _Doc,
    label: str,
    node: Node,
    path: Path,
    *,
    prefix: str = "",
    value: str | None = None,
    url: bool = False,
    proxy: str | None = None,
) -> None:
    """`proxy`: the URL to write, when the label does not say (an anthropic/ model)."""
    if not isinstance(node, ScalarNode):
        return
    if node.tag == _NULL_TAG and value is None:
        _add(doc, node, Action.ENV_SWITCH, f"{label} passes through from the environment")
        return
    old = str(node.value) if value is None else value
    is_key = not url and label in KEY_VARS
    proxy = proxy or doc.options.url_for(label)
    if is_key:
        assert doc.options.proxy_key is not None
        proxy = doc.options.proxy_key
    verdict = judge_key(old, proxy) if is_key else judge_url(old, proxy)
    shown = "a key" if is_key else repr(old)
    if verdict is Verdict.SAME:
        return
    if verdict is not Verdict.REWRITE:
        why = "refers elsewhere: point that at the proxy" if verdict is Verdict.REFERENCE else (
            "is not a URL")  # fmt: skip
        _add(doc, node, Action.NEEDS_HUMAN, f"{label}: {shown} {why}", None if is_key else old)
        return
    if node.style in ("|", ">"):
        _add(doc, node, Action.NEEDS_HUMAN, f"{label} is a block scalar", old)
        return
    if not is_key and is_azure_url(old):
        _add(doc, node, Action.FLAGGED, f"{label}: {shown} is Azure OpenAI: not rewritten", old,
             AZURE.flag)  # fmt: skip
        return
    start = _value_start(doc.text, node.start_mark.index, node.end_mark.index)
    doc.result.edits.append(Edit(start, node.end_mark.index, _render(prefix + proxy, node.style)))
    doc.changed[path] = prefix + proxy
    if is_key:
        doc.result.secrets.add(old)
        _add(doc, node, Action.REWRITE, f"{label} -> the proxy key", None, "<proxy key>")
    else:
        _add(doc, node, Action.REWRITE, f"{label}: {shown} -> proxy", old, proxy)


def _value_start(text: str, start: int, end: int) -> int:
    """A node's mark starts at its `&anchor` or `!tag`, which must survive the edit."""
    while start < end and text[start] in "&!":
        match = _PROPERTY.match(text, start)
        if match is None:
            break
        start = match.end()
    return start


def _render(value: str, style: str | None) -> str:
    # values.validate_* keep quotes and backslashes out, so no escaping is ever needed.
    if style == "'":
        return f"'{value}'"
    if style == '"' or _PLAIN_UNSAFE.fullmatch(value):
        return f'"{value}"'
    return value


def _wanted(name: object, options: RewriteOptions) -> bool:
    return name in URL_VARS or (options.proxy_key is not None and name in KEY_VARS)


def _add(
    doc: _Doc,
    node: Node,
    action: Action,
    message: str,
    old: str | None = None,
    new: str | None = None,
) -> None:
    line = node.start_mark.line + 1
    finding = Finding(doc.rel, line, "yaml", doc.framework, action, message, old, new)
    doc.result.findings.append(finding)


def _verify(text: str, edits: list[Edit], changed: dict[Path, str]) -> None:
    """Prove that the edited text parses to the old data with only `changed` paths changed."""
    from kvmigrate.migrate.text import splice

    loader = YAML(typ="safe", pure=True)
    loader.allow_duplicate_keys = True
    try:
        expected = list(loader.load_all(text))
        for path, value in changed.items():
            _set(expected, path, value)
        actual = list(loader.load_all(splice(text, edits)))
    except (YAMLError, LookupError, TypeError) as exc:
        raise ParseFailure(f"could not verify the rewrite: {_one_line(exc)}") from None
    if actual != expected:
        raise ParseFailure(
            "a rewrite would change more than the targeted values: the value is shared "
            "through a YAML anchor with other keys; edit it by hand"
        )


def _set(data: Any, path: Path, value: str) -> None:
    for step in path[:-1]:
        data = data[step]
    data[path[-1]] = value


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
