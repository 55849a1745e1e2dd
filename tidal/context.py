"""What a step implementation receives: the one interface between the step runner and a step kind.

Invariant: a step kind reads only ``config``, ``seed`` and the committed directories in
``inputs``, and writes only under ``out_dir``. Everything it computes must be a pure
function of those, so that the step id (a hash of kind, name, config, input ids and the
kind's ``STEP_VERSION``) really names its output. The runner owns the commit protocol
(manifest, step.json, ``_SUCCESS``) and tracking; a kind never writes those files.

A step kind is a module exposing::

    STEP_VERSION: int                      # bump when the code's meaning changes
    RESUMABLE: bool = False                # True: out_dir survives failed attempts (training)
    def run(ctx: StepContext) -> dict      # returns a flat summary {metric: number or str}
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.files.output import OutputDir
from tidal.files.step_files import StepFiles, is_uri
from tidal.kinds import KINDS

SPILL_DIR = "_spill"  # a local step's intermediate files, inside its scratch dir (removed before it commits)
SPILL_PREFIX = "spill"  # under a staged job's work prefix: the workers' intermediate files
CHECKSUMS = "checksums"  # under a staged job's work prefix: one {"bytes", "sha256"} record per output file

__all__ = ["MissingInput", "StepContext", "is_uri"]


class MissingInput(KeyError):
    """A step asked for an input it was not given (a standalone job without its ``--input``)."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class StepContext:
    """Everything one step run may read.

    Attributes:
        step_id: ``f"{name}-{hash12}"``, the content address of the output.
        name: the step's name in the graph (``"clean-brown"``, ``"train"``).
        kind: the step kind (``"clean"``, ``"train"`` ...), i.e. the module that runs it.
        config: the step's config as its kind's config model (:attr:`tidal.kinds.KindSpec.config`):
            the model the planner parsed, handed over unchanged; a mapping given here (a job's or a
            test's context) is parsed once, on construction. A kind without a model gets the mapping.
        out_dir: directory to write every output file into. For non-resumable kinds it is
            a fresh scratch directory the runner renames into place after ``run`` returns.
        inputs: input step name -> where that committed step lives: a local directory, or the
            URI of its prefix in the bucket (``s3://bucket/root/{step_id}/``). Read a URI input in
            place with :meth:`input_files`; :meth:`input_dir` downloads a verified local copy.
        input_ids: input step name -> step id (for provenance, e.g. tokenizer hashes).
        seed: a 63-bit seed derived from the recipe seed and the step name; None for a kind
            that draws no random numbers (``tidal/kinds.py`` ``seeded``). Never defaulted.
        log: logger to report progress on.
        resolve: URI of a committed step -> a verified local copy of it, private to this process
            (the storage layer's :meth:`tidal.storage.Storage.input_dir`); needed only for URI inputs.
        out_uri: for a job whose workers write straight to the bucket (the Beam kinds on a staged
            run, :mod:`tidal.data.jobcli`): the attempt's staging location; ``out_dir`` is then unused
            by those kinds. None: write into ``out_dir``.
        work_uri: with ``out_uri``, the attempt's own prefix beside it (``….job/``) for the per-file
            checksum records and the spill files.
    """

    step_id: str
    name: str
    kind: str
    config: Any
    out_dir: Path
    inputs: dict[str, Path | str] = field(default_factory=dict)
    input_ids: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("tidal.step"))
    resolve: Callable[[str], Path] | None = field(default=None, compare=False, repr=False)
    out_uri: str | None = None
    work_uri: str | None = None

    def __post_init__(self) -> None:
        spec = KINDS.get(self.kind)
        if spec is not None:  # pydantic.ValidationError: the kind's model refuses the config
            object.__setattr__(self, "config", spec.parse_config(self.config))

    def output(self) -> OutputDir:
        """Where the step's workers write its outputs: ``out_uri`` (with checksum records under
        ``{work_uri}/checksums``) or ``out_dir`` (:class:`tidal.files.output.OutputDir`)."""
        if self.out_uri:
            return OutputDir(self.out_uri, checksums=f"{self.work_uri.rstrip('/')}/{CHECKSUMS}")
        return OutputDir(self.out_dir)

    def spill(self) -> OutputDir:
        """Where the step's workers put intermediate files every worker must read: ``{work_uri}/spill``
        in the bucket, else ``out_dir/_spill`` (removed before the step commits)."""
        if self.out_uri:
            return OutputDir(f"{self.work_uri.rstrip('/')}/{SPILL_PREFIX}")
        return OutputDir(Path(self.out_dir) / SPILL_DIR)

    def require_seed(self) -> int:
        """The step's seed, for a kind that draws random numbers.

        Raises:
            ValueError: the step has no seed (a seeded kind is never run with a default seed).
        """
        if self.seed is None:
            raise ValueError(f"step {self.name!r} ({self.kind}) needs a seed derived from the recipe seed; "
                             "none was given (standalone jobs: pass --seed)")
        return self.seed

    def _input(self, name: str) -> Path | str:
        try:
            return self.inputs[name]
        except KeyError:
            raise MissingInput(
                f"step {self.name!r} has no input {name!r}; its inputs are {sorted(self.inputs)}"
            ) from None

    def input_dir(self, name: str) -> Path:
        """Input step ``name`` as a local directory: the committed directory itself on a local root;
        for a bucket URI a verified copy downloaded in full into this process's cache. Kinds that
        can read in place use :meth:`input_files` instead (range reads, only what they need).

        Raises:
            MissingInput: naming the missing input and the inputs this step has.
            RuntimeError: the input is a URI and this context has no ``resolve``.
        """
        location = self._input(name)
        if not is_uri(location):
            return Path(str(location).removeprefix("file://"))
        if self.resolve is None:
            raise RuntimeError(f"step {self.name!r}: input {name!r} is {location}, and nothing here can fetch it")
        return self.resolve(str(location))

    def input_uri(self, name: str) -> str:
        """Where input step ``name`` lives, as given: a bucket URI or a local directory path."""
        return str(self._input(name))

    def input_files(self, name: str) -> StepFiles:
        """Input step ``name`` read in place (:class:`tidal.files.step_files.StepFiles`: listing, range reads,
        parquet columns), whether it lives in a local directory or in the bucket.

        Raises:
            MissingInput: naming the missing input and the inputs this step has.
        """
        return StepFiles.open(self.input_uri(name))
