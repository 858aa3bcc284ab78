"""YAML text to Python data, refusing what a plain `yaml.safe_load` lets through silently.

A mapping that names a key twice (`rollout:` twice, `percent:` twice in it, two backends of
one name) loads in PyYAML with the last one winning: the other is dropped without a word.
Here it is a `ConfigError` naming the key's path and both lines. A key a merge (`<<: *base`)
brings in and the mapping then sets itself is an override, as YAML means it, not a repeat.

Aliases of aliases (a "billion laughs": a few hundred bytes standing for 9^9 values) are
refused as the document is composed, at the alias that takes it past `MAX_EXPANDED` nodes:
every reader after this one (the loader, `config check`, an error quoting a value) would
otherwise walk or print each expanded copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvmigrate.config.errors import ConfigError

_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_VALUE = "tag:yaml.org,2002:value"  # `=` as a key, which PyYAML reads as the string "="
_MERGE_KEY = object()  # `<<` as a key: the string "<<" is another key
# Nodes a document may stand for with every alias expanded. A config holds hundreds; merges
# of shared defaults, thousands.
MAX_EXPANDED = 100_000


class _DuplicateKey(Exception):
    """Not a `yaml.YAMLError`: the fast parser's errors send the text to the slow one for
    its messages, and this one already knows the lines."""

    def __init__(
        self, mapping: MappingNode, first: ScalarNode, again: ScalarNode, key: object
    ) -> None:
        super().__init__()
        self.mapping = mapping
        self.first = first
        self.again = again
        self.key = key  # as loaded: True for both `yes` and `true`
        self.path = ""


class _StrictConstructor(SafeConstructor):
    """`SafeConstructor` that refuses a key written twice in one mapping.

    The check runs in `flatten_mapping`, which sees each mapping's own pairs before the
    merged ones are put in front of them. A mapping can be flattened before it is built
    (as the source of a merge) and again when built: only its first flattening is checked,
    the later ones see the merged pairs too."""

    _checked: set[Node]

    def construct_document(self, node: Node) -> Any:
        self._checked = set()
        try:
            return super().construct_document(node)
        except _DuplicateKey as dup:
            dup.path = _key_path(node, dup.mapping, dup.again)
            raise

    def flatten_mapping(self, node: MappingNode) -> None:
        if node not in self._checked:
            self._checked.add(node)
            self._refuse_repeats(node)
        super().flatten_mapping(node)

    def _refuse_repeats(self, node: MappingNode) -> None:
        seen: dict[Any, ScalarNode] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode):
                continue  # a list or mapping as a key: refused as unhashable when built
            tag = key_node.tag
            if tag in (_STR, _VALUE):
                key = key_node.value  # the common case: the text is the key, nothing to build
            elif tag == _MERGE:
                key = _MERGE_KEY
            else:
                # Built as the mapping will build it: `yes` and `true` are one key (True),
                # so are `~` and `null`, and `1` and `1.0` are one dict key in Python.
                key = self.construct_object(key_node)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # unhashable (`!!map ""`): the constructor says so
            if first is not None:  # may be `key_node` itself, given again as an alias
                raise _DuplicateKey(node, first, key_node, key)
            seen[key] = key_node


def _guarded(construct: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """A scalar constructor whose Python errors become YAML errors with their line: PyYAML
    raises ValueError on `2024-13-45` or a 5000-digit integer, AttributeError on
    `!!timestamp x` and KeyError on `!!bool x`, which a config error should name, not crash on."""

    def construct_or_refuse(loader: SafeConstructor, node: ScalarNode) -> Any:
        try:
            return construct(loader, node)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            problem = f"cannot read {node.value[:40]!r} as {kind}"
            detail = str(exc)[:200] if isinstance(exc, ValueError) else ""
            raise ConstructorError(
                None, None, f"{problem}: {detail}" if detail else problem, node.start_mark
            ) from None

    return construct_or_refuse


for _tag, _kind in (
    ("int", "an integer"),
    ("float", "a number"),
    ("bool", "a boolean"),
    ("timestamp", "a date"),
):
    _full_tag = f"tag:yaml.org,2002:{_tag}"
    _StrictConstructor.add_constructor(
        _full_tag, _guarded(SafeConstructor.yaml_constructors[_full_tag], _kind)
    )


class _BoundedComposer(yaml.SafeLoader):
    """The pure-Python composer, counting the nodes the document stands for as it goes: an
    alias counts as every node under its anchor, so the alias that takes the count past
    `MAX_EXPANDED` is refused with its own line before anything is expanded."""

    _expanded: int
    _open: set[str]  # anchors whose node is still being composed
    _sizes: dict[int, int]

    def compose_document(self) -> Node | None:
        self._expanded, self._open, self._sizes = 0, set(), {}
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent):
            mark: Any = event.start_mark  # the stubs' events carry libyaml's marks too
            target = self.anchors.get(event.anchor)
            if target is not None:
                if event.anchor in self._open:
                    raise ComposerError(None, None, _recursive(event.anchor), mark)
                self._expanded += expanded_size(target, self._sizes)
                if self._expanded > MAX_EXPANDED:
                    raise ComposerError(None, None, _too_many(event.anchor), mark)
            return super().compose_node(parent, index)
        self._expanded += 1
        if event.anchor is None:
            return super().compose_node(parent, index)
        self._open.add(event.anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._open.discard(event.anchor)


class _SlowLoader(_StrictConstructor, _BoundedComposer):
    pass


_FAST_BASE: Any = getattr(yaml, "CSafeLoader", None)
_FastLoader: Any = (
    type("_FastLoader", (_StrictConstructor, _FAST_BASE), {}) if _FAST_BASE is not None else None
)


def read_yaml(text: str, source: str) -> Any:
    """The parsed file. Every problem is a `ConfigError`. libyaml's parser, where PyYAML has
    it, takes a tenth of the time of the pure-Python one; a file it refuses is parsed again
    by the latter, whose messages name what it found."""
    try:
        if _FastLoader is not None:
            try:
                return _load(text, _FastLoader)
            except (yaml.YAMLError, UnicodeEncodeError):
                pass  # UnicodeEncodeError: a lone surrogate, which the reader below names
        return _load(text, _SlowLoader)
    except RecursionError:  # thousands of nested brackets: no config is that deep
        raise ConfigError(source, "", "not valid YAML: nested too deeply") from None
    except _DuplicateKey as dup:
        raise ConfigError(source, dup.path, _duplicate_reason(dup)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, "", f"not valid YAML: {where}{problem}") from None


def _load(text: str, loader_class: Any) -> Any:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        # libyaml's composer cannot count as it goes: the graph it built is measured here,
        # and one too large is composed again by the slow one, which names the alias.
        if "*" in text and expanded_size(node, {}) > MAX_EXPANDED:
            raise ComposerError(None, None, _too_many(None), None)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def expanded_size(root: Node, sizes: dict[int, int]) -> int:
    """How many nodes `root` stands for with every alias expanded, at most one more than
    `MAX_EXPANDED`. In one pass over its distinct nodes, each size kept in `sizes` (an alias
    is the node object itself): walking the expansion is what this guards against. A node
    inside itself (`&a [*a]`) stands for endlessly many."""
    over = MAX_EXPANDED + 1
    opened: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:  # post-order without recursion: the nesting depth is the file's choice
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if children_done or not children:
            sizes[id(node)] = min(over, 1 + sum(sizes[id(c)] for c in children))
            continue
        if id(node) in opened:
            return over
        opened.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _too_many(anchor: str | None) -> str:
    alias = f"the alias *{anchor} takes" if anchor else "aliases take"
    return (
        f"{alias} the document past {MAX_EXPANDED:,} nodes, counting every copy an alias "
        "stands for (aliases of aliases, a 'billion laughs'?); write the values out, or "
        "alias fewer times"
    )


def _recursive(anchor: str) -> str:
    return f"the alias *{anchor} is inside the node it names (&{anchor}), which never ends"


def _duplicate_reason(dup: _DuplicateKey) -> str:
    first, again = dup.first.start_mark, dup.again.start_mark
    if dup.first is dup.again:  # `&k a: 1` then `*k: 2`: an alias has no place of its own
        where = f"line {first.line + 1}, and again as an alias of it"
    elif first.line == again.line:  # a flow mapping, `{a: 1, a: 2}`
        where = f"line {first.line + 1}, columns {first.column + 1} and {again.column + 1}"
    else:
        where = f"lines {first.line + 1} and {again.line + 1}"
    if dup.again.tag == _MERGE:
        return f"duplicate key ({where}): merge several mappings with one, as `<<: [*a, *b]`"
    spelled = (_label(dup.first), _label(dup.again))
    same = ""
    if spelled[0] != spelled[1]:
        same = f"{spelled[0]!r} and {spelled[1]!r} both load as the key {dup.key!r}, and "
    return f"duplicate key ({where}): {same}a mapping keeps only the last one; remove the other"


def _label(key: ScalarNode) -> str:
    """The key as written, for paths: `yes`, `0x1`, `~` stay as the file spells them. A key
    of a thousand characters or of several lines would bury the message: cut and quoted."""
    text = str(key.value)
    if not text:
        return '""' if key.tag == _STR else "null"
    if len(text) > 60:
        text = text[:57] + "..."
    return text if text.isprintable() else repr(text)


def _key_path(root: Node, mapping: MappingNode, key: ScalarNode) -> str:
    """The dotted path to `key` in `mapping`, as `Section.key_path` writes it, through the
    first place the file writes the mapping. Depth-first in file order, each node once: an
    alias makes a node reachable by many paths (9^25 in a billion-laughs file)."""
    parents: dict[Node, tuple[Node, str | int] | None] = {}
    stack: list[tuple[Node, tuple[Node, str | int] | None]] = [(root, None)]
    while stack:
        node, parent = stack.pop()
        if node in parents:
            continue
        parents[node] = parent
        if node is mapping:
            return _join(parents, node, _label(key))
        children: list[tuple[str | int, Node]] = []
        if isinstance(node, MappingNode):
            children = [(_label(k), v) for k, v in node.value if isinstance(k, ScalarNode)]
        elif isinstance(node, SequenceNode):
            children = list(enumerate(node.value))
        stack.extend((child, (node, step)) for step, child in reversed(children))
    return _label(key)  # only under a mapping used as a key, which has no path to name


def _join(parents: dict[Node, tuple[Node, str | int] | None], node: Node, last: str) -> str:
    steps: list[str | int] = [last]
    link = parents[node]
    while link is not None:
        node, step = link
        steps.append(step)
        link = parents[node]
    path = ""
    for step in reversed(steps):
        if isinstance(step, int):
            path += f"[{step}]"
        else:
            path = f"{path}.{step}" if path else step
    return path
