"""The base of every config model (recipe sections and step-kind configs): constrained types, the
strict frozen base model, the error type. Below every layer, so each kind can define its config
beside its code and the recipe compose them."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic import Strict as StrictType

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="lower-case hex sha256")]
# Integers are strict: YAML `true` is not 1, and "1e12" (a YAML 1.1 *string*) is not a number.
PositiveInt = Annotated[int, StrictType(), Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class RecipeError(ValueError):
    """A recipe file could not be read or validated; the message names file, field and rule."""


class Strict(BaseModel):
    """Base for every config model: unknown fields are errors, models are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

