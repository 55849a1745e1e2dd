"""The Beam provider's ``BeamRunPythonPipelineOperator``, constructible without the Google provider.

Imported only on the worker (by :class:`operators.remote.ProviderOperator`) and in tests.

Why a shim: with apache-airflow-providers-apache-beam 6.3.1 on Airflow 3.3, the operator cannot
even be constructed unless apache-airflow-providers-google is installed, whatever the runner.
Its Dataflow mixin's ``__init__`` raises ``AirflowOptionalProviderFeatureException``, and Airflow
3.3's ``DagNode.__init__`` calls ``super().__init__()``, which reaches that mixin; ``execute``
then builds the Google provider's ``DataflowConfiguration`` for every runner. Neither does
anything for a runner other than Dataflow.

So: with the Google provider installed (which ``DataflowRunner`` needs anyway), this module
exports the provider's class unchanged. Without it, a subclass that skips only those two
Google-only steps and refuses ``DataflowRunner`` by name; everything else (the command line,
``BeamHook``, the subprocess, its logs, the deferrable trigger) is the provider's own code.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.beam.operators import beam as _beam

GOOGLE_PROVIDER = bool(_beam.GOOGLE_PROVIDER)

if GOOGLE_PROVIDER:
    BeamRunPythonPipelineOperator = _beam.BeamRunPythonPipelineOperator
else:

    class _WithoutGoogle(_beam.BeamDataflowMixin):
        """Stands in front of the Dataflow mixin in the MRO: no Dataflow, nothing to refuse."""

        def __init__(self) -> None:
            pass

    class BeamRunPythonPipelineOperator(_beam.BeamRunPythonPipelineOperator, _WithoutGoogle):  # type: ignore[no-redef]
        """The provider's operator for runners other than Dataflow (no Google provider installed)."""

        def __init__(self, *, runner: str = "DirectRunner", **kwargs: Any) -> None:
            if runner.lower() == _beam.BeamRunnerType.DataflowRunner.lower():
                raise _beam.AirflowOptionalProviderFeatureException(
                    "DataflowRunner needs apache-airflow-providers-google on the Airflow workers")
            super().__init__(runner=runner, **kwargs)

        def _cast_dataflow_config(self) -> None:
            self.dataflow_config = None  # type: ignore[assignment]  # read only on the Dataflow path


__all__ = ["GOOGLE_PROVIDER", "BeamRunPythonPipelineOperator"]
