"""Recipe sections of the data steps. Each is, or is composed of, the config model of the step kind
that reads it, defined beside that kind's code, so a rule or default is typed once:

* a source (:class:`Source`): where its corpus comes from (:class:`tidal.data.fetch_config.FetchSettings`,
  with :class:`tidal.data.archives.Archive`), its own quality filters
  (:class:`tidal.data.filters.QualityFilters`) and languages (:class:`tidal.data.langid.LanguageFilter`),
  and its licence (recipe-only);
* ``clean``: :class:`tidal.data.clean.config.CleanSettings` (with its filters and
  :class:`tidal.data.clean.config.NearDupConfig`);
* ``tokenizer``, ``tokenize``, ``mixture``: :mod:`tidal.data.tokenizer_config`,
  :mod:`tidal.data.tokenize_config`, :mod:`tidal.data.mix_config`;
* ``gate``: :class:`tidal.quality.gates.GateSettings`;
* ``evaluation`` (:class:`EvaluationConfig`, recipe-only);
* ``licences`` (:class:`LicenceDeclaration`, recipe-only, inline or a file: :func:`licences_section`).

Every field here is hashed into the ids of the steps that read it (tidal/core/planner.py), except
a source's licence fields and the ``licences`` section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from tidal.config import RecipeError, Strict
from tidal.data.fetch_config import FetchSettings
from tidal.data.filters import QualityFilters
from tidal.data.heldout import HeldoutSettings
from tidal.data.langid import LanguageFilter
from tidal.eval.config import DownstreamSettings
from tidal.quality.licences import Use
from tidal.quality.spdx import LicenceSyntaxError, licence_id, parse
from tidal.recipe.yaml_file import read_yaml


def _expression(text: str) -> str:
    """A source's ``licence``: a valid SPDX expression, normalized (ValueError names the parse problem)."""
    return parse(text).text


def _unique_uses(uses: list[str]) -> list[str]:
    if len(set(uses)) != len(uses):
        raise ValueError("a use is listed twice")
    return uses


def _non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("must say why (who granted it, where the terms are written), not be blank")
    return text.strip()


LicenceExpression = Annotated[str, AfterValidator(_expression)]
LicenceId = Annotated[str, AfterValidator(licence_id)]


class LicenceDeclaration(Strict):
    """A licence a recipe declares (``licences: {<id>: ...}``): the uses it permits and why. It extends
    or overrides tidal's built-in table (tidal/quality/licence_table.py) for this recipe only (not hashed)."""

    uses: Annotated[list[Use], AfterValidator(_unique_uses)] = Field(
        description="the uses the licence permits: research, commercial, redistribution_of_weights "
        "([] for none)")
    reason: Annotated[str, AfterValidator(_non_empty)] = Field(
        max_length=500, description="why it permits these uses: who decided, and where its terms are written")
    source: str | None = Field(
        default=None, max_length=500, description="where the licence text is: a URL, contract or ticket reference")


class LicenceOverride(Strict):
    """Uses a source's rights holder granted beyond its licence (recorded in MLflow and lineage)."""

    uses: list[Use] = Field(min_length=1, description="uses granted beyond the licence's table row")
    reason: str = Field(min_length=10, description="who granted it and where it is written, e.g. a contract ref")


class Source(FetchSettings):
    """One corpus: where its archive or files come from and how to read them (the fetch step's
    settings), its own filters and languages (the clean step's), and its licence."""

    filters: QualityFilters | None = Field(
        default=None, description="per-source quality filters: each section given here replaces clean.filters'"
    )
    language: LanguageFilter = Field(
        default_factory=LanguageFilter, description="allowed languages of this source (langid)"
    )
    licence: LicenceExpression = Field(
        description="SPDX licence expression of the text: an id (MIT), `A OR B` (either: union of uses), "
        "`A AND B` (both: intersection), `A WITH exception`, or a LicenseRef-<name> declared under `licences:`; "
        "each id must be in tidal/quality/licence_table.py or declared (not hashed)")
    permitted_uses: list[Use] | None = Field(
        default=None, description="narrow the licence's uses (never widen; default: all the licence permits)"
    )
    licence_override: LicenceOverride | None = Field(
        default=None, description="widen the uses of a known or declared licence, with a reason (not hashed)"
    )

    def clean_overrides(self, defaults: QualityFilters) -> dict[str, Any]:
        """The per-source part of the clean step config: merged ``filters`` and ``language``."""
        return {"filters": defaults.overridden_by(self.filters).model_dump(), "language": self.language.model_dump()}


class EvaluationConfig(Strict):
    """What the train step evaluates: whole sources kept out of the mixture (out of distribution, e.g.
    UDHR) and an in-distribution held-out split of every training source (``heldout/<source>``)."""

    sources: list[str] = Field(default_factory=list, description="source names used only for eval loss")
    heldout: HeldoutSettings | None = Field(
        default=None, description="hold out a fraction of every training source's documents (tidal/data/heldout.py)"
    )
    downstream: DownstreamSettings | None = Field(
        default=None, description="lm-evaluation-harness tasks on the final checkpoint (tidal/eval/); none: no "
        "eval step")

    @model_validator(mode="after")
    def _something_to_evaluate(self) -> EvaluationConfig:
        if not self.sources and self.heldout is None:
            raise ValueError("evaluation needs `sources` (held-out sources), `heldout` (a split of the "
                             "training sources) or both")
        return self


LicenceTable = dict[LicenceId, LicenceDeclaration]


def licences_section(value: Any, handler: Any, info: Any) -> dict[str, LicenceDeclaration]:
    """Validate the recipe's ``licences:``: a mapping id -> :class:`LicenceDeclaration`, or the name of a
    YAML file holding that mapping, resolved against the recipe file's directory (the validation
    context's ``recipe_dir``, which :func:`tidal.recipe.load_recipe` sets). The file must lie under that
    directory once symlinks are resolved (a file elsewhere is refused before a byte of it is read, so
    none of its values appears in an error) and be a regular file of at most
    :data:`tidal.recipe.yaml_file.MAX_RECIPE_BYTES` (:func:`tidal.recipe.yaml_file.read_bounded`).

    Raises:
        ValueError: the file is outside the recipe's directory, cannot be read, is not a regular file, is
        too large or no YAML mapping, or the recipe was given as data (no directory);
        ValidationError: a declaration is invalid (in a file: the message names the file).
    """
    if not isinstance(value, str):
        return handler(_declared_once(value))
    base = (info.context or {}).get("recipe_dir")
    if base is None:
        joint = ":" if Path(value).is_absolute() else " is relative, and"
        raise ValueError(f"licences file {value[:200]!r}{joint} this recipe was given as data, not read from a "
                         "file: declare the licences inline "
                         "(rule: a licences file lies under the recipe file's directory)")
    path = Path(base) / value  # an absolute value stays itself
    where, inside = path.resolve(), Path(base).resolve()
    if not where.is_relative_to(inside):  # nothing of a file elsewhere is read, so nothing of it is echoed
        raise ValueError(f"licences file {value[:200]!r}: {where} is outside the recipe's directory {inside} "
                         "(rule: a licences file lies under the recipe file's directory; symlinks are followed)")
    try:
        content = read_yaml(path, "licences")
    except RecipeError as err:
        raise ValueError(f"licences file: {err}") from None
    if not isinstance(content, dict):  # a ValueError: pydantic makes it this field's error, a TypeError it would not
        raise ValueError(  # noqa: TRY004
            f"licences file {path}: must be a YAML mapping of licence id -> {{uses, reason}}, "
            f"got {type(content).__name__}")
    try:
        return handler(_declared_once(content))
    except ValidationError as err:
        raise ValidationError.from_exception_data(err.title, [
            InitErrorDetails(type=PydanticCustomError("licences_file", "{msg}", {
                "msg": f"in {path}: " + ("unknown field" if e["type"] == "extra_forbidden"
                                         else e["msg"].removeprefix("Value error, "))}),
                loc=e["loc"], input=e["input"])
            for e in err.errors()]) from None


def _declared_once(table: Any) -> Any:
    """Refuse two keys that name one licence (``MIT`` and ``mit``; ``GPL-2.0+`` and ``GPL-2.0-or-later``)."""
    if not isinstance(table, dict):
        return table
    seen: dict[str, str] = {}
    for key in table:
        try:
            normal = licence_id(key).lower() if isinstance(key, str) else key
        except LicenceSyntaxError:
            continue  # the key's own validator names the problem
        if normal in seen:
            raise ValueError(f"licence {key!r} is declared twice (also as {seen[normal]!r})")
        seen[normal] = key
    return table
