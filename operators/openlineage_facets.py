"""OpenLineage for tidal's committing tasks, through the official provider.

The provider (``apache-airflow-providers-openlineage``) calls an operator's
``get_openlineage_facets_on_complete`` after a task succeeds and sends the event to the configured
transport (``[openlineage] transport``, e.g. ``{"type": "file", "log_file_path": ...}``; nothing is
sent when no transport is configured). A committing task remembers its step's outcome in
``execute`` (:meth:`StepLineageMixin.remember_lineage`) and reports:

- inputs: the committed steps the step read, as datasets named by their step URIs;
- output: the step's own URI;
- run facet ``tidal_step``: step id, step name, kind, recipe, status (``run``/``skip``), manifest
  root hash, signature status (``step.json`` ``signing``) and the licence of every source upstream.

Dataset names follow the OpenLineage naming spec (https://openlineage.io/docs/spec/naming):
object stores ``s3://bucket`` + key, local files namespace ``file`` + absolute path.
"""

from __future__ import annotations

from typing import Any

from operators.assets import emit_step_asset, read_step_record
from tidal.quality.licences import licence_decisions

__all__ = ["FACET_NAME", "FACET_SCHEMA_URL", "StepLineageMixin", "dataset_name", "step_facet"]

FACET_NAME = "tidal_step"
#: ``_schemaURL`` of the facet: the ``$id`` of docs/openlineage/TidalStepRunFacet.json (shipped in the repository)
FACET_SCHEMA_URL = "urn:tidal:openlineage:TidalStepRunFacet:1"


def dataset_name(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a step URI: ``s3://b/p/x`` -> ``("s3://b", "p/x")``; a local path
    or ``file://`` URI -> ``("file", "/abs/path")``."""
    uri = uri.rstrip("/")
    if uri.startswith("file://"):
        return "file", uri[len("file://"):]
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        bucket, _, key = rest.partition("/")
        return f"{scheme}://{bucket}", key
    return "file", uri


def _upstream_sources(graph: Any, step_name: str) -> list[str]:
    """Source names of every fetch step ``step_name`` is or reads directly or indirectly (sorted)."""
    fetches = (graph[name] for name in (step_name, *graph.ancestors(step_name)))
    return sorted({s.config["source"] for s in fetches if s.kind == "fetch" and "source" in s.config})


def step_facet(pipe: Any, step_name: str, status: str, record: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``tidal_step`` facet's fields for one step of ``pipe`` (a :class:`tidal.core.pipeline.Pipeline`).

    ``manifest_root_hash`` and ``signing`` come from the committed ``step.json`` ``record``
    (:func:`operators.assets.read_step_record`; None when it cannot be read); ``licences`` maps
    each upstream source to its licence and, when the recipe
    widens it, the override's reason (:func:`tidal.quality.licences.licence_decisions`).
    """
    step = pipe.graph[step_name]
    record = record or {}
    decisions = licence_decisions(pipe.recipe.sources, pipe.recipe.licences)
    licences = {}
    for src in _upstream_sources(pipe.graph, step_name):
        decision = decisions.get(src, {})
        override = decision.get("override")
        licences[src] = {"licence": decision.get("licence"),
                         "override": override.get("reason") if isinstance(override, dict) else None}
    signing = record.get("signing") or {}
    return {"step_id": step.step_id, "step": step.name, "kind": step.kind, "recipe": pipe.recipe.name,
            "status": status, "manifest_root_hash": record.get("manifest_root_hash"),
            "signature_status": signing.get("status"), "signing_key_id": signing.get("key_id"),
            "licences": licences}


class StepLineageMixin:
    """Adds OpenLineage facets to an operator that commits a step (provider's operator protocol)."""

    _tidal_lineage: dict[str, Any] | None = None

    def announce_step(self, context: Any, pipe: Any, result: Any, run_key: str) -> None:
        """After the step committed (or was found committed): emit its asset event
        (:func:`operators.assets.emit_step_asset`) and remember its OpenLineage facets, from one
        read of its ``step.json``. Never raises for lineage: the step is committed."""
        record = read_step_record(pipe, pipe.graph[result.name].step_id)
        emit_step_asset(context, pipe, result, run_key, self.log, record=record)
        self.remember_lineage(pipe, result, record)

    def remember_lineage(self, pipe: Any, result: Any, record: dict[str, Any] | None) -> None:
        """Record what the task committed (or found committed) for the completion event; ``record``
        is its ``step.json`` (None: unreadable). Never raises: lineage must not fail a committed step."""
        try:
            step = pipe.graph[result.name]
            self._tidal_lineage = {
                "inputs": [pipe.storage.step_uri(dep.step_id) for dep in step.inputs],
                "output": pipe.storage.step_uri(step.step_id),
                "facet": step_facet(pipe, result.name, result.status, record),
            }
        except Exception as err:  # noqa: BLE001 - lineage is best effort, the step is committed
            self.log.warning("OpenLineage facets of %s not built: %s", result.name, err)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """:class:`OperatorLineage` with the step's input and output datasets and the
        ``tidal_step`` run facet; None when ``execute`` recorded nothing."""
        if not self._tidal_lineage:
            return None
        import attr
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import Dataset
        from openlineage.client.facet_v2 import RunFacet

        @attr.define
        class TidalStepRunFacet(RunFacet):
            """tidal's step record; fields as :func:`step_facet`."""

            step_id: str
            step: str
            kind: str
            recipe: str
            status: str
            manifest_root_hash: str | None = None
            signature_status: str | None = None
            signing_key_id: str | None = None
            licences: dict = attr.field(factory=dict)

            @staticmethod
            def _get_schema() -> str:
                return FACET_SCHEMA_URL

        lineage = self._tidal_lineage
        return OperatorLineage(
            inputs=[Dataset(*dataset_name(uri)) for uri in lineage["inputs"]],
            outputs=[Dataset(*dataset_name(lineage["output"]))],
            run_facets={FACET_NAME: TidalStepRunFacet(**lineage["facet"])},
        )
