"""Values that satisfy a JSON schema, for tool-call arguments and structured output.

Covers what function and response schemas use in practice: objects with properties and
`required`, arrays, strings (with enums, formats and length limits), numbers and integers
(with bounds), booleans, null, `anyOf`/`oneOf`/`allOf`, `const`, and local `$ref`s to
`$defs`/`definitions`. String values reuse words of the prompt so that arguments relate to
what the user asked, as a model's would.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

_MAX_DEPTH = 6
_FILLER = ("example", "default", "value", "item", "sample", "general")


class SchemaValues:
    """Generates one value per call; deterministic for a given `rng` state."""

    def __init__(self, root: Mapping[str, Any], vocabulary: Sequence[str], rng: random.Random):
        self._root = root
        self._words = list(vocabulary) or list(_FILLER)
        self._rng = rng

    def value(self, schema: Mapping[str, Any] | None = None, name: str = "", depth: int = 0) -> Any:
        schema = self._resolve(self._root if schema is None else schema)
        if depth > _MAX_DEPTH:
            return None
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self._rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            options = [self._resolve(o) for o in schema.get(key) or [] if isinstance(o, Mapping)]
            non_null = [o for o in options if o.get("type") != "null"]
            if options:
                return self.value((non_null or options)[0], name, depth + 1)
        if isinstance(schema.get("allOf"), list):
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                merged.update(self._resolve(part))
            return self.value(merged, name, depth + 1)
        return self._typed(schema, self._type_of(schema), name, depth)

    def _resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        ref = schema.get("$ref")
        for _ in range(_MAX_DEPTH):
            if not isinstance(ref, str) or not ref.startswith("#/"):
                break
            target: Any = self._root
            for part in ref[2:].split("/"):
                target = target.get(part, {}) if isinstance(target, Mapping) else {}
            schema = target if isinstance(target, Mapping) else {}
            ref = schema.get("$ref")
        return schema

    @staticmethod
    def _type_of(schema: Mapping[str, Any]) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if isinstance(kind, str):
            return kind
        if "properties" in schema:
            return "object"
        if "items" in schema:
            return "array"
        return "string"

    def _typed(self, schema: Mapping[str, Any], kind: str, name: str, depth: int) -> Any:
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, name, depth)
        if kind == "integer":
            low = int(schema.get("minimum", 1))
            high = int(schema.get("maximum", max(low, 10)))
            return self._rng.randint(low, max(low, high))
        if kind == "number":
            floor = float(schema.get("minimum", 0.0))
            ceiling = float(schema.get("maximum", floor + 100.0))
            return round(self._rng.uniform(floor, max(floor, ceiling)), 2)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema, name)

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            return {}
        required = schema.get("required")
        # Optional properties are left out, as models mostly do; all of them when none is
        # required, so that a schema with no `required` list still gets a useful object.
        names = [n for n in properties if n in required] if isinstance(required, list) else []
        if not names:
            names = list(properties)
        return {n: self.value(properties[n], n, depth + 1) for n in names}

    def _array(self, schema: Mapping[str, Any], name: str, depth: int) -> list[Any]:
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
        low = max(int(schema.get("minItems", 0)), 0)
        count = max(low, min(2, int(schema.get("maxItems", 2))))
        return [self.value(items, name, depth + 1) for _ in range(count)]

    def _string(self, schema: Mapping[str, Any], name: str) -> str:
        fmt = schema.get("format")
        if fmt == "date-time":
            return f"2025-0{self._rng.randint(1, 9)}-1{self._rng.randint(0, 9)}T10:00:00Z"
        if fmt == "date":
            return f"2025-0{self._rng.randint(1, 9)}-1{self._rng.randint(0, 9)}"
        if fmt == "email":
            return f"{self._rng.choice(self._words).lower()}@example.com"
        if fmt in ("uri", "url"):
            return f"https://example.com/{self._rng.choice(self._words).lower()}"
        text = self._phrase(name)
        min_len = int(schema.get("minLength", 0))
        max_len = int(schema.get("maxLength", 0)) or None
        while len(text) < min_len:
            text += " " + self._rng.choice(self._words)
        return text[:max_len] if max_len else text

    def _phrase(self, name: str) -> str:
        lowered = name.lower()
        if any(hint in lowered for hint in ("city", "location", "place", "country", "name")):
            proper = [w for w in self._words if w[:1].isupper()]
            if proper:
                # The last capitalised word: the first is often just a sentence's start.
                return proper[-1]
        count = 1 if len(lowered) < 8 else 2
        return " ".join(self._rng.choice(self._words) for _ in range(count))
