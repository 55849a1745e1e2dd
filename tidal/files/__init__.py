"""Files of steps where they live (a local directory or a prefix in a bucket), without copying them.

``step_files`` reads a committed step in place (:class:`tidal.files.step_files.StepFiles`: listing,
whole small files checked against the manifest, byte ranges, parquet columns); ``npy`` reads rows of a
``.npy`` as byte ranges (:class:`tidal.files.npy.NpyRows`); ``output`` is where a running step writes
(:class:`tidal.files.output.OutputDir`). This package re-exports nothing: import the module.
"""
