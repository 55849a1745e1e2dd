"""A small real Beam step kind for failure tests: writes ``records`` lines of ``bytes`` characters
through ``beam.io.WriteToText`` into the step's output, with the in-process runner."""

from __future__ import annotations

STEP_VERSION = 1


def run(ctx):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    size = int(ctx.config["bytes"])
    options = PipelineOptions(["--runner=FnApiRunner", "--direct_num_workers=1"])
    with beam.Pipeline(options=options) as p:
        (p | beam.Create(range(int(ctx.config["records"])))
           | beam.Map(lambda i: f"{i:08d} " + "x" * size)
           | beam.io.WriteToText(str(ctx.out_dir / "part"), num_shards=2))
    return {"records": ctx.config["records"]}
