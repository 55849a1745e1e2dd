"""Steps and step graphs: content addresses derived from what a step computes.

Invariant: ``step_id = f"{name}-{sha256(canonical_json(kind, name, config, input ids,
STEP_VERSION))[:12]}"``, and nothing else enters the hash (of the config, a kind's location keys
are left out when the config pins its input's content: :attr:`tidal.kinds.KindSpec.location_keys`).
Storage root, runner, resource shape, git sha and timestamps are recorded in ``step.json`` but
never hashed, so changing *where* or *how fast* never recomputes anything, while changing one
config field gives that step and all its descendants new ids. Ids are derived properties of frozen steps, never
stored, so nothing can drift out of sync.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tidal.integrity.hashing import canonical_json, sha256_bytes
from tidal.kinds import kind_spec

ID_HASH_CHARS = 12


@dataclass(frozen=True)
class Step:
    """One content-addressed unit of work.

    Attributes:
        name: unique name in the graph, e.g. ``"clean-brown"``; the Airflow task id.
        kind: key into :data:`tidal.kinds.KINDS`.
        config: JSON-able config; every field of it is hashed, except a kind's location keys
            when the config holds its content pin (:attr:`tidal.kinds.KindSpec.location_keys`).
        inputs: the steps whose committed outputs this one reads.
        model: ``config`` parsed into the kind's config model (:attr:`tidal.kinds.KindSpec.config`),
            by the kind's planning function at plan time (:func:`tidal.core.plans.planned`); never
            hashed. What the step's run receives (:attr:`typed_config`).
    """

    name: str
    kind: str
    config: Mapping[str, Any]
    inputs: tuple[Step, ...] = ()
    model: Any = field(default=None, compare=False, repr=False)

    @property
    def typed_config(self) -> Any:
        """The config as the kind's run receives it: the model parsed at plan time, else (a step
        built by hand) ``config`` parsed now (:meth:`tidal.kinds.KindSpec.parse_config`)."""
        if self.model is not None:
            return self.model
        return kind_spec(self.kind).parse_config(dict(self.config))

    @cached_property
    def hash_input(self) -> dict[str, Any]:
        """Exactly what enters the step id hash (shown by ``tidal explain``)."""
        spec = kind_spec(self.kind)
        config = dict(self.config)
        if spec.pin_key is not None and config.get(spec.pin_key) is not None:
            config = {k: v for k, v in config.items() if k not in spec.location_keys}
        return {
            "kind": self.kind,
            "name": self.name,
            "config": config,
            "inputs": {step.name: step.step_id for step in self.inputs},
            "step_version": spec.version,
        }

    @cached_property
    def step_id(self) -> str:
        """``{name}-{first 12 hex of sha256 of canonical_json(hash_input)}``, ``name`` the hashed one."""
        digest = sha256_bytes(canonical_json(self.hash_input).encode())
        return f"{self.hash_input['name']}-{digest[:ID_HASH_CHARS]}"


@dataclass(frozen=True)
class CommittedStep(Step):
    """A step committed earlier (by this recipe or another, under the same storage root) that a step
    of this graph reads, e.g. the train step a continued run starts from.

    Its identity is still derived, not stored: ``hash_input`` is the one its ``step.json`` recorded,
    and :attr:`step_id` hashes it as for any step (a ``step.json`` edited to claim another id gives
    another id; :func:`tidal.core.continuation.committed_step` refuses it). ``name`` is its name in
    this graph (the input name its reader sees); ``kind`` and ``config`` are the recorded ones. It has
    no inputs here: it is never computed by this graph, only read.
    """

    recorded: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def hash_input(self) -> dict[str, Any]:
        """The recorded hash input (``step.json``), as it was when the step was committed."""
        return dict(self.recorded)


@dataclass(frozen=True)
class StepGraph:
    """Steps in topological order (inputs before the steps that read them)."""

    steps: tuple[Step, ...]
    by_name: dict[str, Step] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seen: dict[str, Step] = {}
        for step in self.steps:
            if step.name in seen:
                raise ValueError(f"two steps are named {step.name!r}")
            for dep in step.inputs:
                if dep.name not in seen:
                    raise ValueError(f"step {step.name!r} reads {dep.name!r}, which is not before it")
            seen[step.name] = step
        object.__setattr__(self, "by_name", seen)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __getitem__(self, name: str) -> Step:
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"no step named {name!r}; steps: {list(self.by_name)}") from None

    def find(self, name_or_id: str) -> Step:
        """A step by name or by step id.

        Raises:
            KeyError: listing the step names.
        """
        for step in self.steps:
            if name_or_id in (step.name, step.step_id):
                return step
        raise KeyError(f"no step named or with id {name_or_id!r}; steps: {list(self.by_name)}")

    def ancestors(self, name: str) -> list[str]:
        """Names of every step ``name`` reads directly or indirectly, in graph order.

        Raises:
            KeyError: ``name`` is not a step of the graph.
        """
        seen: set[str] = set()
        stack = list(self[name].inputs)
        while stack:
            step = stack.pop()
            if step.name not in seen:
                seen.add(step.name)
                stack.extend(step.inputs)
        return [s.name for s in self.steps if s.name in seen]

    def descendants(self, name: str) -> list[str]:
        """Names of every step that reads ``name`` directly or indirectly, in graph order."""
        out: set[str] = {name}
        for step in self.steps:
            if any(dep.name in out for dep in step.inputs):
                out.add(step.name)
        return [s.name for s in self.steps if s.name in out and s.name != name]


def derive_seed(recipe_seed: int, step_name: str) -> int:
    """A 63-bit seed for one step: sha256 of ``"{recipe_seed}:{step_name}"``, first 8 bytes."""
    digest = hashlib.sha256(f"{recipe_seed}:{step_name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
