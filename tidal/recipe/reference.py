"""A short recipe field reference in Markdown, generated from the recipe's JSON Schema.

``tidal recipe-schema --markdown`` prints it; the docs site's recipe reference page is generated from
it at build time (tools/docs/reference.py), so the reference never drifts from :class:`tidal.recipe.Recipe`.
Two levels: each top-level field, and the fields of each section (``train.steps``,
``sources.<name>.path``); deeper structures are named by type, see ``tidal recipe-schema``.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["markdown_reference"]


def _values(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The schema of a mapping's values (``additionalProperties`` or the one ``patternProperties``)."""
    if isinstance(schema.get("additionalProperties"), dict):
        return schema["additionalProperties"]
    patterns = list((schema.get("patternProperties") or {}).values())
    return patterns[0] if len(patterns) == 1 else None


def _ref(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The definition a property points at (directly, through ``allOf``/``anyOf`` or a mapping's
    values), if it is an object with properties."""
    for candidate in [schema, *schema.get("allOf", []), *schema.get("anyOf", []), _values(schema) or {}]:
        ref = candidate.get("$ref", "")
        if ref.startswith("#/$defs/") and "properties" in defs.get(ref[8:], {}):
            return defs[ref[8:]]
    return None


def _type(schema: dict[str, Any]) -> str:
    """A compact type: ``int``, ``str | null``, ``list[str]``, ``map[str, Source]``, ``one of a, b``."""
    names = {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "null": "null",
             "object": "map", "array": "list"}
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " | ".join(dict.fromkeys(_type(s) for s in schema[key]))
    kind = schema.get("type")
    if kind == "array":
        return f"list[{_type(schema.get('items', {}))}]"
    if kind == "object" and _values(schema) is not None:
        return f"map[str, {_type(_values(schema))}]"
    return names.get(kind, str(kind or "any"))


def _help(schema: dict[str, Any]) -> str:
    """The first sentence of a field's description, on one line, pipes escaped."""
    text = " ".join((schema.get("description") or "").split())
    first = re.split(r"(?<!e\.g)(?<!i\.e)\. (?=[A-Z`])", text)[0].rstrip(".")
    return (first + "." if first else "").replace("|", "\\|")


def _default(schema: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in schema:
        return ""
    value = json.dumps(schema["default"], sort_keys=True)
    return f"`{value}`" if len(value) <= 40 else "(see schema)"


def markdown_reference(schema: dict[str, Any]) -> str:
    """The reference table of ``schema`` (``Recipe.model_json_schema()``) as Markdown.

    Returns:
        One table, a row per field: dotted field (``sources.<name>.path`` for a mapping's values),
        type, default (``required`` when it has none) and the first sentence of its help.
    """
    defs = schema.get("$defs", {})
    rows = ["| field | type | default | help |", "|---|---|---|---|"]

    def row(name: str, prop: dict[str, Any], required: bool) -> None:
        kind = _type(prop).replace("|", "\\|")
        rows.append(f"| `{name}` | {kind} | {_default(prop, required)} | {_help(prop)} |")

    top_required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        row(name, prop, name in top_required)
        section = _ref(prop, defs)
        if section is None:
            continue
        prefix = f"{name}.<name>" if _values(prop) is not None else name
        required = set(section.get("required", []))
        for sub, sub_prop in section["properties"].items():
            row(f"{prefix}.{sub}", sub_prop, sub in required)
    return "\n".join(rows) + "\n"
