"""Structured output: is the answer valid JSON, and valid against the requested schema?

It applies when the request asks for JSON (`response_format` json_object or json_schema, or
the Responses API's `text.format`), or when the primary answered with a JSON document
anyway (a prompt that asks for JSON in words). The candidate agrees unless it is worse: a
candidate that produces valid JSON where the primary did not is no regression.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jsonschema import SchemaError, validators

from kvmigrate.parity.context import PairContext
from kvmigrate.parity.result import ComparatorResult

_FENCE = "```"


def requested_format(request: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any] | None]:
    """('json_object' | 'json_schema' | None, the schema when one was given)."""
    fmt = request.get("response_format")
    text = request.get("text")
    if not isinstance(fmt, dict) and isinstance(text, dict):
        fmt = text.get("format")  # the Responses API puts it here, with the schema inline
    if not isinstance(fmt, dict):
        fmt = _messages_format(request)
    if not isinstance(fmt, dict):
        return None, None
    kind = fmt.get("type")
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        holder: dict[str, Any] = inner if isinstance(inner, dict) else fmt
        schema = holder.get("schema")
        return kind, schema if isinstance(schema, dict) else None
    return (kind, None) if kind == "json_object" else (None, None)


def _messages_format(request: Mapping[str, Any]) -> Any:
    """Anthropic's structured outputs: `output_config.format`, or the beta's top-level
    `output_format`, both `{"type": "json_schema", "schema": {...}}`."""
    config = request.get("output_config")
    if isinstance(config, dict) and isinstance(config.get("format"), dict):
        return config["format"]
    return request.get("output_format")


def parse_json(text: str) -> tuple[bool, Any]:
    stripped = text.strip()
    if stripped.startswith(_FENCE):
        # Models often fence JSON in markdown; what is inside is what a client parses.
        stripped = stripped.strip("`").removeprefix("json").strip()
    try:
        return True, json.loads(stripped)
    except ValueError:
        return False, None


def schema_errors(schema: Mapping[str, Any], value: Any) -> list[str]:
    """Validation messages; a schema that is itself invalid yields none (not the answer's
    fault)."""
    schema = dict(schema)
    try:
        validator_class = validators.validator_for(schema)
        validator_class.check_schema(schema)
    except SchemaError:
        return []
    validator = validator_class(schema)
    return [error.message for error in validator.iter_errors(value)][:5]


def compare_structured(ctx: PairContext) -> ComparatorResult | None:
    kind, schema = requested_format(ctx.request)
    primary, candidate = ctx.texts
    p_valid, p_value = parse_json(primary)
    if kind is None and not (p_valid and isinstance(p_value, dict | list)):
        return None
    if ctx.primary_answer.is_tool_answer or ctx.candidate_answer.is_tool_answer:
        return None
    c_valid, c_value = parse_json(candidate)
    data: dict[str, Any] = {"primary_valid_json": p_valid, "candidate_valid_json": c_valid}
    if p_valid and not c_valid:
        return ComparatorResult("structured", False, 0.0, "candidate is not valid JSON", data)
    if schema is None or not c_valid:
        return ComparatorResult("structured", True, 1.0, _json_detail(p_valid, c_valid), data)
    p_errors = schema_errors(schema, p_value) if p_valid else ["not JSON"]
    c_errors = schema_errors(schema, c_value)
    data.update(primary_schema_valid=not p_errors, candidate_schema_valid=not c_errors)
    if c_errors and not p_errors:
        detail = f"candidate violates the schema: {c_errors[0]}"
        return ComparatorResult("structured", False, 0.5, detail, data)
    return ComparatorResult("structured", True, 1.0, "both valid against the schema", data)


def _json_detail(p_valid: bool, c_valid: bool) -> str:
    if p_valid and c_valid:
        return "both valid JSON"
    return "neither is valid JSON" if not c_valid else "only the candidate is valid JSON"
