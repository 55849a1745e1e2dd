"""A suite file as a :class:`tidal.core.pipeline.Pipeline`: same run, status and tracking, its own graph.

``Pipeline.load`` hands suite files (top-level ``kind: scaling_suite``) here, so ``tidal plan /
explain / run`` and the Airflow operators work on suites unchanged. The storage root is, in
order: the argument or ``TIDAL_STORAGE_ROOT`` (against the cwd), the suite's ``storage_root``
(against the suite file's directory), else the base recipe's own root resolved exactly as for
the base recipe, so the suite shares the base recipe's committed data steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tidal.core.pipeline import Pipeline, _flatten
from tidal.core.planner import build_suite_graph
from tidal.integrity.hashing import canonical_json, sha256_bytes
from tidal.integrity.provenance import git_sha
from tidal.quality.licences import licence_tags
from tidal.scaling.suite import Suite, SuiteError, load_suite
from tidal.settings import current as current_settings
from tidal.steps import StepGraph
from tidal.storage import open_storage
from tidal.tracking import experiment_name


@dataclass(frozen=True)
class SuitePipeline(Pipeline):
    """A loaded suite: ``recipe`` is the base recipe, ``suite`` the grid and fit settings."""

    suite: Suite | None = None

    @classmethod
    def load_suite(cls, path: str | Path, overrides: dict[str, Any] | None = None,
                   storage_root: str | None = None) -> SuitePipeline:
        """Load and validate a suite file and its base recipe.

        Raises:
            tidal.scaling.suite.SuiteError: bad suite or base recipe; ``overrides`` are refused.
        """
        path = Path(path).resolve()
        if overrides:
            raise SuiteError(f"{path}: overrides are not supported for suite files; edit the file")
        suite, base = load_suite(path)
        override = storage_root or current_settings().storage_root
        settings = base.storage.settings()
        if override:
            storage = open_storage(override, settings=settings)
        elif suite.storage_root:
            storage = open_storage(suite.storage_root, base=path.parent, settings=settings)
        else:  # the base recipe's root, resolved as for the base recipe itself
            storage = open_storage(base.storage_root, base=(path.parent / suite.base).resolve().parent,
                                   settings=settings)
        tracking = current_settings().tracking_uri or suite.tracking_uri or base.tracking_uri
        return cls(path, base, storage, tracking, suite=suite)

    @cached_property
    def graph(self) -> StepGraph:
        """Data steps of the base recipe, one train step per grid point, the fit step."""
        return build_suite_graph(self.suite, self.recipe)

    @cached_property
    def recipe_hash(self) -> str:
        """sha256 of the canonical JSON of the suite and its base recipe."""
        data = {"suite": self.suite.model_dump(mode="json"), "base": self.recipe.model_dump(mode="json")}
        return sha256_bytes(canonical_json(data).encode())

    @property
    def experiment(self) -> str:
        """The MLflow experiment of the suite's runs: the suite's own name, not the base recipe's."""
        return experiment_name(self.suite.name)

    def parent_run(self, run_key: str) -> str | None:
        """The MLflow parent run for ``run_key``, with the suite's fields as params."""
        params = _flatten({"suite": self.suite.model_dump(mode="json"), "base": self.recipe.name})
        tags = {"tidal.recipe": self.suite.name, "tidal.recipe_version": str(self.suite.version),
                "tidal.recipe_hash": self.recipe_hash, "tidal.recipe_path": str(self.recipe_path),
                "tidal.suite_base": self.recipe.name, "tidal.git_sha": git_sha()}
        tags |= licence_tags(self.recipe.sources, self.recipe.intended_use, self.recipe.licences)  # the base recipe
        return self.tracker().parent_run(run_key, params=params, tags=tags)
