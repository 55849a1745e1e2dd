"""Data steps: fetch pinned archives, read source formats, clean, tokenize, mix, stats.

Each step kind here is a module with ``STEP_VERSION`` and ``run(ctx)`` (see
:mod:`tidal.context`) and is runnable standalone as ``python -m tidal.data.<kind>``.
"""
