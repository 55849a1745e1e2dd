"""The base of every config model (recipe sections and step-kind configs): constrained types, the
strict frozen base model, the error type. Below every layer, so each kind can define its config
beside its code and the recipe compose them."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic import Strict as StrictType

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="lower-case hex sha256")]
# Integers are strict: YAML `true` is not 1, and "1e12" (a YAML 1.1 *string*) is not a number.
PositiveInt = Annotated[int, StrictType(), Field(gt=0)]
# Shard files are named {prefix}-SSSSS-of-NNNNN.{ext} (tidal.data.shards.shard_name): five digits.
MAX_SHARDS = 99_999
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class RecipeError(ValueError):
    """A recipe file could not be read or validated; the message names file, field and rule."""


class Strict(BaseModel):
    """Base for every config model: unknown fields are errors, models are immutable."""

    # allow_inf_nan=False: an infinite or NaN float is refused at load; it has no canonical JSON
    # form, so it could never be hashed into a step id.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


SHOWN_INPUT_CHARS = 80  # an error echoes at most this much of the value it refused


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_INPUT_CHARS else f"{text[:SHOWN_INPUT_CHARS]}... ({len(text):,} characters)"


def _looks_numeric(text: str) -> bool:
    try:
        float(text.replace("_", ""))
    except ValueError:
        return False
    return True


def problems(err: ValidationError, *, unknown: str = "unknown field", yaml_hints: bool = False) -> list[str]:
    """Every problem of a config model's refusal as ``dotted.field: rule (got value)``: the one
    formatter of recipes, suites, step configs and training specs.

    Args:
        unknown: the rule shown for a field the model does not have.
        yaml_hints: add a hint when YAML read a number as text (``1e12`` is a string in YAML 1.1).

    The refused value is shown as its ``repr``, cut to :data:`SHOWN_INPUT_CHARS` characters (an
    error line never echoes megabytes of a user's input); mappings and missing fields show none.
    """
    lines = []
    for item in err.errors():
        loc = ".".join(_loc_part(part) for part in item["loc"]) or "(top level)"
        got = item.get("input")
        rule = unknown if item["type"] == "extra_forbidden" else item["msg"].removeprefix("Value error, ")
        if yaml_hints and isinstance(got, str) and _looks_numeric(got):
            rule += f" (YAML read {_shown(got)} as text: write plain digits, or a float like 1.0e+12)"
        shown = "" if isinstance(got, dict) or item["type"] == "missing" else f" (got {_shown(got)})"
        lines.append(f"{loc}: {rule}{shown}")
    return lines


def _loc_part(part: object) -> str:
    """A part of a field path as written, or its cut ``repr`` when it is a user's key that is no plain
    name (a space, markup, a NUL, 300 characters: the line stays one short line)."""
    text = str(part)
    if text == "[key]":
        return "(name)"
    return text if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text) else _shown(text)


def _endpoint_url(value: str | None) -> str | None:
    """An S3 API endpoint: ``http(s)://host[:port]``, nothing after it (a path would silently
    address another bucket layout: botocore prepends it to every key)."""
    if value is None:
        return None
    from urllib.parse import urlparse

    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path not in ("", "/") \
            or parsed.query or parsed.fragment or "@" in parsed.netloc:
        raise ValueError("must be http(s)://host[:port] with no path, query or credentials, "
                         "e.g. http://127.0.0.1:9000 or https://storage.googleapis.com")
    return value.rstrip("/")


EndpointUrl = Annotated[str | None, AfterValidator(_endpoint_url)]
"""An S3 endpoint URL (``TIDAL_S3_ENDPOINT_URL``, the recipe's ``storage.endpoint_url``)."""


def field_error(model: str, loc: tuple[str | int, ...], message: str, value: Any = None) -> ValidationError:
    """A validation error at ``loc`` (relative to the model validating), for a model validator whose
    rule spans fields: raised from it, pydantic prefixes the outer path, so the recipe error names
    ``mixture.size.tokens`` rather than ``(top level)`` or the section."""
    from pydantic_core import InitErrorDetails, PydanticCustomError

    return ValidationError.from_exception_data(model, [InitErrorDetails(
        type=PydanticCustomError("tidal_rule", "{msg}", {"msg": message}), loc=loc, input=value)])


def omit_unused(data: dict[str, Any], unused: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a model's dump) without each key of ``unused`` whose value is the one meaning "not
    used" (``{"mesh": None}``). A config's ``model_serializer`` calls it so that an option a recipe does
    not use stays out of step configs and the recipe hash: adding the option changes no existing id."""
    for key, value in unused.items():
        if key in data and data[key] == value:
            del data[key]
    return data
