"""The table of step kinds: each kind's typed interface (its config model, planning function and
run function) and its STEP_VERSION.

A kind's config is parsed once, at plan time, into its config model (:attr:`KindSpec.config`) by
its planning function (:attr:`KindSpec.plan`), and that model is what its run function
(:attr:`KindSpec.run`) receives, in-process, through the Beam provider or in a pod (there
serialized once, as the model's JSON, and parsed once on the other side: :meth:`KindSpec.parse_config`).

Names and versions are data here, not imports (dotted paths, resolved on first use), so that
planning a graph and parsing a DAG file never import Beam, JAX or GX. Each module also defines
``STEP_VERSION``; a test checks that the two agree, so a version bump cannot be made in one place
only. Bump a version whenever the meaning of a kind's output changes: every step of that kind
(and its descendants) then gets a new id and is recomputed.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any


@cache
def resolve(path: str) -> Any:
    """The object a dotted path names (``tidal.data.clean.config.CleanConfig``), imported on first use."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class KindSpec:
    """One step kind: its module, its version (hashed), whether its output dir is kept
    across failed attempts (training resumes from checkpoints there), and its typed interface
    as dotted paths: ``config`` its config model (a pydantic model; None: the config is plain
    JSON data, as for test kinds), ``plan`` its planning function (``plan(planning) -> list[Step]``,
    :mod:`tidal.core.plans`), ``run`` its run function (default ``{module}.run``)."""

    module: str
    version: int
    resumable: bool = False
    beam: bool = False  # a Beam job: runs in-process or as a job command on a Beam runner
    seeded: bool = False  # draws random numbers: its config carries the recipe seed, its context a derived one
    # config keys that only say where the input lives, and the key that pins its content: when the
    # config holds the pin, the step id leaves the location out (same bytes elsewhere, same id)
    location_keys: tuple[str, ...] = ()
    pin_key: str | None = None
    config: str | None = None
    plan: str | None = None
    run: str | None = None

    def load(self) -> ModuleType:
        """Import the module that implements the kind (heavy: Beam, JAX, GX)."""
        return importlib.import_module(self.module)

    def config_model(self) -> Any:
        """The kind's config model class (light: pydantic and the kind's config module), or None."""
        return None if self.config is None else resolve(self.config)

    def planner(self) -> Callable[..., Any]:
        """The kind's planning function (:mod:`tidal.core.plans`).

        Raises:
            LookupError: the kind names none (a test kind: its steps are built by hand).
        """
        if self.plan is None:
            raise LookupError(f"step kind {self.module} has no planning function")
        return resolve(self.plan)

    def runner(self) -> Callable[..., Any]:
        """The kind's run function, ``run(ctx) -> summary`` (heavy: imports the kind's module)."""
        return resolve(self.run or f"{self.module}.run")

    def parse_config(self, data: Any) -> Any:
        """``data`` as the kind's config model: a mapping is validated, the model's JSON text
        parsed, a model instance returned unchanged; without a model, the plain JSON data.

        Raises:
            pydantic.ValidationError: the model refuses ``data`` (or it is no JSON text).
            json.JSONDecodeError: a kind without a model, and ``data`` is no JSON text.
        """
        model = self.config_model()
        if model is None:
            return json.loads(data) if isinstance(data, str | bytes) else data
        if isinstance(data, model):
            return data
        if isinstance(data, str | bytes):
            return model.model_validate_json(data)
        return model.model_validate(data)

    def config_json(self, config: Any) -> str:
        """The one serialized form of a step's config (its model's JSON, or the plain JSON data), as
        a job command's ``config.json`` holds it; :meth:`parse_config` reads it back."""
        data = config.model_dump(mode="json") if hasattr(config, "model_dump") else dict(config)
        return json.dumps(data, indent=1, sort_keys=True) + "\n"


PLANS = "tidal.core.plans"
KINDS: dict[str, KindSpec] = {  # in planning order (tidal.core.planner.build_graph)
    "fetch": KindSpec("tidal.data.fetch", 3, location_keys=("path",), pin_key="snapshot_sha256",
                      config="tidal.data.fetch_config.FetchConfig", plan=f"{PLANS}.plan_fetch"),
    "clean": KindSpec("tidal.data.clean", 7, beam=True, config="tidal.data.clean.config.CleanConfig",
                      plan=f"{PLANS}.plan_clean", run="tidal.data.clean.step.run"),
    "decontaminate": KindSpec("tidal.data.decontaminate", 1,
                              config="tidal.data.decontaminate_config.DecontaminateConfig",
                              plan=f"{PLANS}.plan_decontaminate"),
    "tokenizer": KindSpec("tidal.data.tokenizer", 1, config="tidal.data.tokenizer_config.TokenizerConfig",
                          plan=f"{PLANS}.plan_tokenizer"),
    "tokenize": KindSpec("tidal.data.tokenize", 2, beam=True, config="tidal.data.tokenize_config.TokenizeConfig",
                         plan=f"{PLANS}.plan_tokenize"),
    "mix": KindSpec("tidal.data.mix", 1, seeded=True, config="tidal.data.mix_config.MixConfig",
                    plan=f"{PLANS}.plan_mix"),
    "stats": KindSpec("tidal.data.stats", 4, config="tidal.data.stats_config.StatsConfig", plan=f"{PLANS}.plan_stats"),
    "gate": KindSpec("tidal.quality.gates", 2, config="tidal.quality.gate_config.GateConfig",
                     plan=f"{PLANS}.plan_gate"),
    "train": KindSpec("tidal.train", 3, resumable=True, seeded=True, config="tidal.train.config.TrainStepConfig",
                      plan=f"{PLANS}.plan_train"),
    "eval": KindSpec("tidal.eval.step", 1, config="tidal.eval.config.EvalStepConfig", plan=f"{PLANS}.plan_eval"),
    "scaling_fit": KindSpec("tidal.scaling.fit_step", 2, seeded=True, config="tidal.scaling.suite.FitStepConfig",
                            plan=f"{PLANS}.plan_scaling_fit"),
}

BEAM_KINDS = frozenset(name for name, spec in KINDS.items() if spec.beam)


def kind_spec(kind: str) -> KindSpec:
    """The spec of ``kind``.

    Raises:
        KeyError: naming the unknown kind and the known ones.
    """
    try:
        return KINDS[kind]
    except KeyError:
        raise KeyError(f"unknown step kind {kind!r}; known kinds: {sorted(KINDS)}") from None
