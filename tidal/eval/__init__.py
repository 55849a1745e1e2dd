"""Downstream evaluation of trained checkpoints through lm-evaluation-harness: the ``eval`` step kind
(:mod:`tidal.eval.step`), the model adapter (:mod:`tidal.eval.lm`), the local task suite
(:mod:`tidal.eval.suite`, built by :mod:`tidal.eval.build_tasks`) and its recipe section
(:mod:`tidal.eval.config`). This package file stays light: the recipe imports the config."""
