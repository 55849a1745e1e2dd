"""The table of step kinds: which module runs each kind and the kind's STEP_VERSION.

Versions are data here, not imports, so that planning a graph and parsing a DAG file never
import Beam, JAX or GX. Each module also defines ``STEP_VERSION``; a test checks that the
two agree, so a version bump cannot be made in one place only. Bump a version whenever the
meaning of a kind's output changes: every step of that kind (and its descendants) then gets
a new id and is recomputed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class KindSpec:
    """One step kind: its module, its version (hashed), whether its output dir is kept
    across failed attempts (training resumes from checkpoints there)."""

    module: str
    version: int
    resumable: bool = False
    beam: bool = False  # a Beam job: runs in-process or as a job command on a Beam runner
    seeded: bool = False  # draws random numbers: its config carries the recipe seed, its context a derived one
    # config keys that only say where the input lives, and the key that pins its content: when the
    # config holds the pin, the step id leaves the location out (same bytes elsewhere, same id)
    location_keys: tuple[str, ...] = ()
    pin_key: str | None = None

    def load(self) -> ModuleType:
        """Import the module that implements the kind (heavy: Beam, JAX, GX)."""
        return importlib.import_module(self.module)


KINDS: dict[str, KindSpec] = {
    "fetch": KindSpec("tidal.data.fetch", 3, location_keys=("path",), pin_key="snapshot_sha256"),
    "clean": KindSpec("tidal.data.clean", 6, beam=True),
    "decontaminate": KindSpec("tidal.data.decontaminate", 1),
    "tokenizer": KindSpec("tidal.data.tokenizer", 1),
    "tokenize": KindSpec("tidal.data.tokenize", 2, beam=True),
    "mix": KindSpec("tidal.data.mix", 1, seeded=True),
    "stats": KindSpec("tidal.data.stats", 4),
    "gate": KindSpec("tidal.quality.gates", 2),
    "train": KindSpec("tidal.train", 3, resumable=True, seeded=True),
    "eval": KindSpec("tidal.eval.step", 1),
    "scaling_fit": KindSpec("tidal.scaling.fit_step", 2, seeded=True),
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
