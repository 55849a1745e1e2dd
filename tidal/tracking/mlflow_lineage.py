"""MLflow 3 lineage objects of a step run: its input steps as datasets, its checkpoints as logged models,
and the final checkpoint as a version in the model registry.

Invariant: nothing here reads, hashes or copies data. A dataset is described by metadata only
(``mlflow.data.meta_dataset.MetaDataset``: name = the input step's name, source = its URI under the
storage root, digest = its manifest root hash, which the commit already computed); a logged model's
files stay where the checkpoint is (its URI is the tag ``tidal.checkpoint_uri`` of the logged model and
of the registered version, whose source is the logged model, ``models:/<model id>``).
So logging the lineage of a step with a terabyte of inputs costs the same few
MLflow calls as a step with a kilobyte.

Every call is idempotent, because a buffered :meth:`tidal.tracking.Tracker.log_step` payload may be
replayed after part of it was delivered: a checkpoint's logged model is found again by its tags
(``tidal.step_id``, ``tidal.checkpoint_step``), a registered version by ``tidal.logged_model_id``; only
the run's dataset inputs and model outputs are logged again (MLflow keeps one row per pair).

The descriptions are plain frozen dataclasses with a JSON form (:meth:`Lineage.to_json`), so they ride
in the tracker's pending buffer; the caller (tidal/core/mlflow_lineage.py) builds them from the
storage root, which tracking never imports.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tidal.tracking.client import is_per_machine
from tidal.tracking.limits import MAX_TAG_VALUE, _chunks, _text

# MLflow's ``MAX_DATASET_DIGEST_SIZE`` (mlflow/utils/validation.py, 3.17): a dataset digest holds at most
# 36 characters, so it is the root hash's first 36 hex digits (144 bits); the full hash is in the
# dataset's profile and in the input's ``tidal.manifest_root_hash`` tag.
DIGEST_CHARS = 36
MAX_DATASETS_PER_CALL = 1000  # MLflow's MAX_DATASETS_PER_BATCH
MODEL_TYPE = "tidal-checkpoint"
# mlflow.data.context values MLflow's UI shows for a run's inputs, by the kind of the run's step
CONTEXT_OF_KIND = {"train": "training", "eval": "evaluation"}


# MLflow error codes that mean "this request is refused" (a bad source, a disabled registry), not "MLflow is
# down": such a call is not retried nor buffered, and does not hold the URI as unreachable
# (tidal.tracking.client.retry_call); the step's run is kept without the refused object.
REFUSALS = frozenset({"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "PERMISSION_DENIED", "FEATURE_DISABLED",
                      "ENDPOINT_NOT_FOUND", "RESOURCE_DOES_NOT_EXIST"})


# What a tracking store's database says when a concurrent writer inserted the same unique row first (two
# runs on one root logging the same input dataset, registering the same model): SQLite, PostgreSQL,
# MySQL. MLflow answers it as BAD_REQUEST; the call is made again, and then finds the other's row.
LOST_RACE = ("UNIQUE constraint failed", "duplicate key value violates unique constraint", "Duplicate entry")
RACE_ATTEMPTS = 3


class LineageRefused(RuntimeError):
    """MLflow answered a lineage call with a refusal (:data:`REFUSALS`); the message names the call and
    MLflow's reason."""


def _guarded(retry: Callable[[str, Callable[[], Any]], Any]) -> Callable[[str, Callable[[], Any]], Any]:
    """``retry`` for lineage calls: a refusal (:data:`REFUSALS`) raises :class:`LineageRefused` at once
    instead of counting as an outage; a lost insert race (:data:`LOST_RACE`) is made again first."""

    def call(what: str, fn: Callable[[], Any]) -> Any:
        from mlflow.exceptions import MlflowException

        refused: list[MlflowException] = []

        def once() -> Any:
            for attempt in range(RACE_ATTEMPTS):
                try:
                    return fn()
                except MlflowException as err:
                    if attempt + 1 < RACE_ATTEMPTS and any(words in str(err.message) for words in LOST_RACE):
                        continue  # another writer's row is there now (LOST_RACE)
                    if err.error_code not in REFUSALS:
                        raise
                    refused.append(err)
                    return None
            return None

        result = retry(what, once)
        if refused:
            raise LineageRefused(f"mlflow {what} refused: {refused[0].message}") from refused[0]
        return result

    return call


@dataclass(frozen=True)
class StepDataset:
    """One committed input step, described by metadata only.

    Attributes:
        name: the step's name in the graph (``tokenize-brown``): the dataset's name.
        step_id: its content address (``tokenize-brown-0123456789ab``).
        kind: its step kind.
        uri: where its committed files live (a path or ``s3://bucket/prefix/<step_id>``): the source.
        manifest_root_hash: the root hash of its ``manifest.json`` (64 hex digits): the digest.
        total_bytes: the bytes its manifest lists, if known (shown in the profile; never measured here).
    """

    name: str
    step_id: str
    kind: str
    uri: str
    manifest_root_hash: str
    total_bytes: int | None = None


@dataclass(frozen=True)
class CheckpointModel:
    """One kept checkpoint of a train step, logged as an MLflow ``LoggedModel``.

    Attributes:
        step_id: the train step's id; checkpoint_step: completed optimizer steps at the save.
        uri: the checkpoint's directory under the storage root (``.../<step_id>/checkpoints/<n>``).
        root_hash: the checkpoint manifest's root hash (its files' integrity hash).
        params_sha256: :func:`tidal.train.checkpoints.tree_sha256` of its parameters, or None when the
            checkpoint's manifest does not record it.
        final: the checkpoint the run ended with (the one registered).
    """

    step_id: str
    checkpoint_step: int
    uri: str
    root_hash: str
    params_sha256: str | None = None
    final: bool = False

    @property
    def name(self) -> str:
        """The logged model's name: ``<step_id>-checkpoint-<n>``."""
        return f"{self.step_id}-checkpoint-{self.checkpoint_step}"

    def tags(self) -> dict[str, str]:
        """The logged model's tags (``tidal.*``; ``tidal.params_sha256`` only when known)."""
        tags = {"tidal.step_id": self.step_id, "tidal.checkpoint_step": str(self.checkpoint_step),
                "tidal.checkpoint_root_hash": self.root_hash, "tidal.checkpoint_uri": self.uri,
                "tidal.final": "true" if self.final else "false"}
        if self.params_sha256:
            tags["tidal.params_sha256"] = self.params_sha256
        return tags


@dataclass(frozen=True)
class Registration:
    """Where the final checkpoint goes in the model registry.

    Attributes:
        name: the registered model's name (tidal uses the recipe's experiment name, ``tidal-<recipe>``).
        licence: the training sources' licences as one SPDX expression (``A AND B``).
        intended_use: the recipe's ``intended_use``, comma-separated (``research``).
        tags: further version tags (``tidal.licence.<source>`` ...).
    """

    name: str
    licence: str
    intended_use: str
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Lineage:
    """What a step run logs beside its metrics: ``datasets`` (its inputs), ``context`` (MLflow's
    ``mlflow.data.context`` input tag: ``training``, ``evaluation`` or ``input``), ``models`` (a train
    step's kept checkpoints) and ``registration`` (for the final checkpoint; None: register nothing)."""

    datasets: tuple[StepDataset, ...] = ()
    context: str = "input"
    models: tuple[CheckpointModel, ...] = ()
    registration: Registration | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (the pending buffer's form); :meth:`from_json` reads it back."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lineage:
        """The :class:`Lineage` of :meth:`to_json`'s dict.

        Raises:
            TypeError, KeyError: ``data`` is not such a dict.
        """
        reg = data.get("registration")
        return cls(tuple(StepDataset(**d) for d in data.get("datasets", ())), data.get("context", "input"),
                   tuple(CheckpointModel(**m) for m in data.get("models", ())),
                   Registration(**reg) if reg else None)

    def __bool__(self) -> bool:
        return bool(self.datasets or self.models)


def _meta_dataset(item: StepDataset):
    """The MLflow entity of one input step: a ``MetaDataset`` over the source MLflow resolves for the
    URI (``LocalArtifactDatasetSource``, ``S3ArtifactDatasetSource`` ...), with a profile naming the
    full root hash. Nothing is read from the URI.

    Raises:
        LineageRefused: MLflow knows no dataset source for the URI's scheme.
    """
    import json

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    class StepMetaDataset(MetaDataset):
        def to_dict(self) -> dict[str, str]:
            profile = {"step_id": item.step_id, "kind": item.kind, "manifest_root_hash": item.manifest_root_hash}
            if item.total_bytes is not None:
                profile["total_bytes"] = item.total_bytes
            return super().to_dict() | {"profile": json.dumps(profile, sort_keys=True)}

    from mlflow.exceptions import MlflowException

    with warnings.catch_warnings():  # a local path resolves through two registered file schemes alike
        warnings.simplefilter("ignore", UserWarning)
        try:
            source = resolve_dataset_source(item.uri)
        except MlflowException as err:
            raise LineageRefused(f"no MLflow dataset source for {item.uri}: {err.message}") from err
    return StepMetaDataset(source, name=item.name, digest=item.manifest_root_hash[:DIGEST_CHARS])._to_mlflow_entity()


def log_datasets(client: Any, retry: Callable[[str, Callable[[], Any]], Any], run_id: str, lineage: Lineage) -> int:
    """Log ``lineage.datasets`` as run ``run_id``'s dataset inputs (``MlflowClient.log_inputs``).

    Each input carries the tags ``mlflow.data.context`` (``lineage.context``), ``tidal.step_id`` and
    ``tidal.manifest_root_hash``. ``retry(what, fn)`` runs each MLflow call (the tracker's retries).

    Returns:
        The number of datasets logged.

    Raises:
        TrackingUnavailable: from ``retry``.
        LineageRefused: MLflow refused a call.
    """
    from mlflow.entities import DatasetInput, InputTag

    retry = _guarded(retry)
    inputs = [DatasetInput(_meta_dataset(d), tags=[
        InputTag("mlflow.data.context", lineage.context), InputTag("tidal.step_id", d.step_id),
        InputTag("tidal.manifest_root_hash", d.manifest_root_hash)]) for d in lineage.datasets]
    for chunk in _chunks(inputs, MAX_DATASETS_PER_CALL):
        retry("log input datasets", lambda c=chunk: client.log_inputs(run_id, datasets=c))
    return len(inputs)


def _quoted(value: str) -> str:
    if "'" in value:
        raise ValueError(f"MLflow filter value may not contain a single quote: {value!r}")
    return f"'{value}'"


def _logged_model(client: Any, retry: Callable, experiment_id: str, run_id: str, model: CheckpointModel,
                  extra_tags: dict[str, str]) -> str:
    """The id of ``model``'s logged model: found again by its tags, else created (READY)."""
    where = (f"tags.`tidal.step_id` = {_quoted(model.step_id)} AND "
             f"tags.`tidal.checkpoint_step` = {_quoted(str(model.checkpoint_step))}")
    found = retry("find logged model", lambda: client.search_logged_models([experiment_id], filter_string=where,
                                                                            max_results=1))
    tags = {k: _text(v, MAX_TAG_VALUE) for k, v in (model.tags() | extra_tags).items()}
    if found:
        model_id = found[0].model_id
        retry("tag logged model", lambda: client.set_logged_model_tags(model_id, tags))
        return model_id
    created = retry("create logged model", lambda: client.create_logged_model(
        experiment_id, name=model.name, source_run_id=run_id, tags=tags, model_type=MODEL_TYPE))
    retry("finalize logged model", lambda: client.finalize_logged_model(created.model_id, "READY"))
    return created.model_id


def _register(client: Any, retry: Callable, run_id: str, model: CheckpointModel, model_id: str,
              registration: Registration, source: str) -> str:
    """The version number of ``model_id`` in ``registration.name``; registered now if it is not."""
    name = registration.name

    def get_or_create() -> None:
        from mlflow.exceptions import MlflowException

        if client.search_registered_models(f"name = {_quoted(name)}", max_results=1):
            return
        try:
            client.create_registered_model(
                name, description="tidal: the final checkpoint of each train step of this recipe")
        except MlflowException as err:  # another process registered it first: fine
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise

    retry("get/create registered model", get_or_create)
    found = retry("find model version", lambda: client.search_model_versions(
        f"name = {_quoted(name)} AND tags.`tidal.logged_model_id` = {_quoted(model_id)}", max_results=1))
    if found:
        return str(found[0].version)
    tags = {"licence": registration.licence, "intended_use": registration.intended_use,
            "tidal.logged_model_id": model_id} | model.tags() | registration.tags
    version = retry("create model version", lambda: client.create_model_version(
        name, source=source, run_id=run_id, tags={k: _text(v, MAX_TAG_VALUE) for k, v in tags.items()},
        description=f"{model.name}: checkpoint root hash {model.root_hash}", await_creation_for=0,
        model_id=model_id))
    return str(version.version)


def log_models(client: Any, retry: Callable[[str, Callable[[], Any]], Any], experiment_id: str, run_id: str,
               lineage: Lineage, uri: str) -> dict[str, str]:
    """One logged model per checkpoint of ``lineage.models`` (``MlflowClient.create_logged_model``,
    model type ``tidal-checkpoint``, source run ``run_id``), each linked as an output of the run at its
    checkpoint step (``log_outputs``); the final one also registered as a version of
    ``lineage.registration.name`` (``create_registered_model`` on first use, ``create_model_version``
    and tags ``licence``, ``intended_use``, ``tidal.*``).

    The version's source: on a server (``uri`` not :func:`tidal.tracking.client.is_per_machine`)
    ``models:/<model id>``, as ``mlflow.register_model`` does, because a server refuses a local path
    outside its artifact store; on a SQLite or file store the checkpoint's URI itself (its registry
    resolves ``models:/`` through the process-global tracking URI, MLflow 3.17's own TODO in
    ``SqlAlchemyStore.create_model_version``). Either way the tag ``tidal.checkpoint_uri`` names the
    files, which are never copied.

    Returns:
        ``{logged model name: model id}``, plus ``"registered_version"`` when one was registered.

    Raises:
        TrackingUnavailable: from ``retry``.
        LineageRefused: MLflow refused a call.
    """
    from mlflow.entities import LoggedModelOutput

    retry = _guarded(retry)
    reg = lineage.registration
    out: dict[str, str] = {}
    for model in lineage.models:
        extra = ({"licence": reg.licence, "intended_use": reg.intended_use} if reg and model.final else {})
        model_id = _logged_model(client, retry, experiment_id, run_id, model, extra)
        retry("link logged model", lambda m=model_id, s=model.checkpoint_step: client.log_outputs(
            run_id, [LoggedModelOutput(m, s)]))
        out[model.name] = model_id
        if reg is not None and model.final:
            source = model.uri if is_per_machine(uri) else f"models:/{model_id}"
            out["registered_version"] = _register(client, retry, run_id, model, model_id, reg, source)
    return out


__all__ = ["CONTEXT_OF_KIND", "DIGEST_CHARS", "MODEL_TYPE", "REFUSALS", "CheckpointModel", "Lineage",
           "LineageRefused", "Registration",
           "StepDataset", "log_datasets", "log_models"]
