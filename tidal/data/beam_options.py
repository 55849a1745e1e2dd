"""Beam pipeline options for every tidal data job: where and how fast, never what.

Default: Beam's in-process ``FnApiRunner`` with one worker. We name it rather than
``DirectRunner`` because Beam 2.6x+'s DirectRunner first tries the Prism runner, which
downloads a Go binary from GitHub at run time; tidal never downloads at run time, and the
FnApiRunner is what the DirectRunner falls back to anyway. ``$TIDAL_BEAM_ARGS`` (shell
words) adds or overrides options, e.g. ``--direct_num_workers=2
--direct_running_mode=multi_processing`` or ``--runner=DataflowRunner --project=...``.
Runner options are not part of any step config, so they never change a step id.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

BEAM_ARGS_ENV = "TIDAL_BEAM_ARGS"
DEFAULT_ARGS = ("--runner=FnApiRunner", "--direct_num_workers=1")


def beam_args(extra: Sequence[str] = ()) -> list[str]:
    """The pipeline arguments: defaults, then ``$TIDAL_BEAM_ARGS``, then ``extra`` (later wins)."""
    return [*DEFAULT_ARGS, *shlex.split(os.environ.get(BEAM_ARGS_ENV, "")), *extra]


def beam_options(extra: Sequence[str] = ()) -> PipelineOptions:
    """:class:`PipelineOptions` from :func:`beam_args`."""
    return PipelineOptions(beam_args(extra))
