"""The whole recipe (:class:`Recipe`): its sections and the rules that span them (sources
named by the mixture and evaluation exist, training fits the accelerator, the licence gate)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic import Strict as StrictType
from pydantic_core import InitErrorDetails, PydanticCustomError

from tidal.config import PositiveInt, Strict, field_error
from tidal.data.clean.config import CleanSettings
from tidal.data.decontaminate_config import DecontaminationSettings
from tidal.data.mix_config import MixtureSettings
from tidal.data.mix_sizing import requested_total
from tidal.data.tokenize_config import TokenizeSettings
from tidal.data.tokenizer_config import TokenizerSettings
from tidal.quality.gate_config import GateSettings
from tidal.quality.licences import Use, gate_problems
from tidal.recipe.data import EvaluationConfig, LicenceTable, Source, licences_section
from tidal.recipe.operations import SCHEDULE_PRESETS, BaselineConfig, BeamConfig, StorageConfig
from tidal.recipe.training import TrainSection
from tidal.train.sizing import check_recipe_fits

# A source's name becomes step names (``fetch-<name>``), task ids, path components, metric keys
# (``eval_loss/<name>``) and MLflow run names: letters, digits, '_' and '-', starting with a letter
# or digit, at most 64 characters (no space, ':', '/', '.', markup or NUL; so no '..' either).
SOURCE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
SourceName = Annotated[str, Field(pattern=SOURCE_NAME_PATTERN)]


def _or_file_name(schema: dict) -> None:
    """JSON schema of ``licences``: the mapping, or a file name (read by :func:`licences_section`)."""
    mapping = {k: v for k, v in schema.items() if k not in ("description", "title", "default")}
    for key in list(mapping):
        schema.pop(key)
    schema["anyOf"] = [mapping, {"type": "string", "description": "a YAML file of such declarations, "
                                 "relative to the recipe file; a regular file under the recipe file's directory, "
                                 "at most 1 MiB"}]


MAX_NAME_LENGTH = 100  # leaves room for prefixes and suffixes within 255-byte file names and DAG ids


class Recipe(Strict):
    """A whole pretraining recipe: sources, data steps, gate, training."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=MAX_NAME_LENGTH,
                      description=f"DAG id suffix: tidal_<name>; at most {MAX_NAME_LENGTH} characters (it becomes "
                      "the DAG id, run keys and file names, which have length limits: 255 bytes a file name, "
                      "250 characters an Airflow DAG id)")
    version: PositiveInt = Field(description="bump when the recipe's intent changes")
    description: str = ""
    seed: Annotated[int, StrictType(), Field(ge=0)] = Field(description="every step seed derives from it")
    sources: dict[SourceName, Source] = Field(
        min_length=1, description=f"source name -> source; names match {SOURCE_NAME_PATTERN}")
    intended_use: list[Use] = Field(
        min_length=1, description="research, commercial, redistribution_of_weights: every source must permit "
        "each (tidal/quality/licences.py; not hashed)"
    )
    licences: LicenceTable = Field(
        default_factory=dict, json_schema_extra=_or_file_name,
        description="licences this recipe declares beyond tidal's table (tidal/quality/licence_table.py), or "
        "overrides for this recipe: SPDX id or LicenseRef-<name> -> {uses, reason, source}; or the name of a YAML "
        "file holding that mapping, relative to the recipe file and under its directory (a regular file, at "
        "most 1 MiB: never a device, a FIFO or a file elsewhere; not hashed)",
    )
    clean: CleanSettings = CleanSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    tokenize: TokenizeSettings = TokenizeSettings()
    mixture: MixtureSettings
    evaluation: EvaluationConfig
    decontamination: DecontaminationSettings | None = Field(
        default=None, description="remove training paragraphs (or documents) holding the eval sources' n-grams "
        "before tokenizing (tidal/data/decontaminate.py); none: no decontaminate step")
    gate: GateSettings
    train: TrainSection = TrainSection()
    storage_root: str = Field(
        default=".tidal",
        description="where step outputs live, relative to the recipe file's directory (not hashed)",
    )
    tracking_uri: str | None = Field(default=None, description="MLflow URI (not hashed)")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="object-store settings (not hashed)")
    beam: BeamConfig = Field(default_factory=BeamConfig, description="where Beam data steps run (not hashed)")
    schedule: str | None = Field(
        default=None,
        description="when Airflow reruns the recipe for validation: a cron expression (5 fields) or a preset "
        f"({', '.join(SCHEDULE_PRESETS)}); none: manual trigger only (not hashed)",
    )
    baseline: BaselineConfig | None = Field(
        default=None, description="known-good stats and loss curve that runs are compared with (not hashed)"
    )

    @field_validator("licences", mode="wrap")
    @classmethod
    def _licences_file(cls, value: object, handler: ValidatorFunctionWrapHandler,
                       info: ValidationInfo) -> dict:
        return licences_section(value, handler, info)

    @field_validator("schedule")
    @classmethod
    def _schedule_form(cls, schedule: str | None) -> str | None:
        if schedule is None or schedule in SCHEDULE_PRESETS:
            return schedule
        fields = schedule.split()
        if len(fields) != 5 or not all(re.fullmatch(r"[0-9A-Za-z*,/\-]+", f) for f in fields):
            raise ValueError(f"schedule {schedule!r}: write a 5-field cron expression ('0 3 * * *') "
                             f"or one of {', '.join(SCHEDULE_PRESETS)}")
        from croniter import croniter  # what Airflow's CronTriggerTimetable parses cron with

        if not croniter.is_valid(schedule):
            raise ValueError(f"schedule {schedule!r}: not a valid cron expression (a field out of range or "
                             "unknown name; minute 0-59, hour 0-23, day 1-31, month 1-12, weekday 0-6)")
        return schedule

    @model_validator(mode="after")
    def _sources_exist(self) -> Recipe:
        named = (("mixture.weights", self.mixture.weights), ("evaluation.sources", self.evaluation.sources))
        for field, names in named:
            unknown = sorted(set(names) - set(self.sources))
            if unknown:
                raise ValueError(f"{field} names unknown sources {unknown}; known: {sorted(self.sources)}")
        overlap = sorted(set(self.mixture.weights) & set(self.evaluation.sources))
        if overlap:
            raise ValueError(f"sources {overlap} are both in the training mixture and held out for evaluation")
        return self

    @model_validator(mode="after")
    def _decontaminate_against_something(self) -> Recipe:
        if self.decontamination is not None and not self.evaluation.sources:
            raise field_error("Recipe", ("decontamination",), (
                "needs evaluation.sources to check the training sources against (the held-out split "
                "evaluation.heldout is already kept out of training by document)"), self.decontamination.model_dump())
        if self.gate.max_contaminated_fraction is not None and self.decontamination is None:
            raise field_error("Recipe", ("gate", "max_contaminated_fraction"),
                              "bounds the decontaminate steps' stats: set decontamination too",
                              self.gate.max_contaminated_fraction)
        return self

    @model_validator(mode="after")
    def _budget_passes_gate(self) -> Recipe:
        total = requested_total(self.mixture.size, None, self.tokenize.seq_len)
        if total is not None and total * self.tokenize.seq_len < self.gate.min_total_tokens:
            raise field_error("Recipe", ("mixture", "size", "tokens"), (
                f"{total * self.tokenize.seq_len:,} tokens (in whole sequences of {self.tokenize.seq_len}) is below "
                f"gate.min_total_tokens {self.gate.min_total_tokens:,}: the gate would fail every run; raise the "
                "budget or lower the bound"), self.mixture.size.tokens)
        return self

    @model_validator(mode="after")
    def _training_fits(self) -> Recipe:
        check_recipe_fits(self)  # MemoryPlanError (a ValueError): the compiled sizing's figure or every analytical term
        return self

    @model_validator(mode="after")
    def _licence_gate(self) -> Recipe:
        problems = gate_problems(self.sources, self.intended_use, self.licences)
        if problems:  # one error per problem, each at its field (sources.<name>.licence ...)
            raise ValidationError.from_exception_data("Recipe", [
                InitErrorDetails(type=PydanticCustomError("licence_gate", "{msg}", {"msg": p.message}),
                                 loc=p.loc, input=p.value)
                for p in problems])
        return self

    @property
    def train_sources(self) -> list[str]:
        """Names of the sources in the training mixture, sorted."""
        return sorted(self.mixture.weights)

    @property
    def eval_sources(self) -> list[str]:
        """Names of the held-out evaluation sources, sorted."""
        return sorted(self.evaluation.sources)

    @property
    def heldout_fraction(self) -> float | None:
        """``evaluation.heldout.fraction``: the share of each training source held out, or None."""
        heldout = self.evaluation.heldout
        return None if heldout is None else heldout.fraction

