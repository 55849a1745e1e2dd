"""``tidal export`` and ``tidal sample``: a committed train step's model, exported or sampled.

A target is read as ``tidal verify`` and ``tidal lineage`` read one (:func:`tidal.audit.ancestry.resolve_target`):
a step directory or step id names that step; a recipe file or an MLflow run key names its ``train`` step.
The work is in :mod:`tidal.train.hf_export` and :mod:`tidal.train.sample`; the model is read by
:func:`tidal.train.trained.load_trained`. Light at import (the parser is built from here).

Exit status: 0 done; 1 a step or checkpoint that cannot be read (one ``error:`` line, from :mod:`tidal.cli`);
2 a target that names no committed local train step, or a bad option (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tidal.audit.ancestry import TargetError, resolve_target
from tidal.storage import LocalStorage
from tidal.train.config import ConfigError


def train_step_dir(target: str, recipe: str | None = None, storage_root: str | None = None) -> Path:
    """The directory of the committed train step ``target`` names.

    Raises:
        tidal.audit.ancestry.TargetError: the target names nothing (see ``resolve_target``), no train step, a
            step that is not committed, or one under an object-store root (read it from a local copy).
    """
    found = resolve_target(target, recipe=recipe, storage_root=storage_root)
    step_id = found.final[0] if found.kind == "step" else found.steps.get("train")
    if step_id is None:
        raise TargetError(f"{target}: names no train step (steps: {', '.join(found.steps) or 'none'})")
    if not isinstance(found.storage, LocalStorage):
        raise TargetError(f"{target}: step {step_id} is under an object-store root; export and sample read a local "
                          "step directory (copy the step down, e.g. `aws s3 sync`, and pass its directory)")
    if not found.storage.is_committed(step_id):
        raise TargetError(f"{target}: step {step_id} under {found.storage.root} is not committed (no _SUCCESS); "
                          "only a committed train step is exported or sampled")
    return Path(found.storage.step_dir(step_id))


def add_commands(sub: argparse._SubParsersAction, func: Callable[[argparse.Namespace], int]) -> None:
    """Add ``export`` and ``sample`` to the ``tidal`` parser's subcommands, both dispatched to ``func``."""
    for name, help_text in (
        ("export", "write a train step's checkpoint as a Hugging Face Llama model (safetensors, config, tokenizer)"),
        ("sample", "generate text from a train step's checkpoint: greedy, or seeded top-p sampling"),
    ):
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("step", help="train step directory or id, recipe file or MLflow run key (its train step)")
        cmd.add_argument("--recipe", help="recipe whose storage root and tracking store hold a step id / run key")
        cmd.add_argument("--storage-root", help="storage root holding a step id / run key (or TIDAL_STORAGE_ROOT)")
        cmd.add_argument("--checkpoint", type=int, help="step of a kept checkpoint (default: the final one)")
        cmd.set_defaults(func=func)
    export, sample = sub.choices["export"], sub.choices["sample"]
    export.add_argument("--format", choices=["hf"], default="hf", help="hf: Hugging Face LlamaForCausalLM")
    export.add_argument("--out", help="output directory (default: ./<step id>-hf)")
    sample.add_argument("--prompt", required=True, help="text to continue")
    sample.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate at most (default 32)")
    sample.add_argument("--temperature", type=float, help="sample at this temperature (default: greedy; 1.0 when "
                        "--top-p or --seed is given)")
    sample.add_argument("--top-p", type=float, help="nucleus sampling: keep the most probable tokens up to this "
                        "probability mass, in (0, 1] (default 1.0)")
    sample.add_argument("--seed", type=int, help="seed of the sampling (default 0): the same seed, the same text")
    sample.add_argument("--json", action="store_true", help="print ids, texts and settings as JSON")


def run_command(args: argparse.Namespace) -> int:
    """Run ``tidal export`` or ``tidal sample`` (``args.command``); returns the exit status."""
    from tidal.train.sample import Sampling

    try:  # target and options first: a bad one is reported before any checkpoint is read
        settings = None
        if args.command == "sample":
            settings = Sampling.of(args.max_new_tokens, args.temperature, args.top_p, args.seed)
            if not args.prompt or not args.prompt.strip():
                raise ConfigError("--prompt: empty; give the text to continue")
        out = getattr(args, "out", None) if args.command == "export" else None
        if out is not None and Path(out).exists() and not Path(out).is_dir():
            raise ConfigError(f"--out {out}: is a file, not a directory; export writes a directory of files "
                              "(give a new or empty directory)")
        step_dir = train_step_dir(args.step, recipe=args.recipe, storage_root=args.storage_root)
    except (TargetError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from tidal.train.trained import load_trained

    started = time.perf_counter()
    model = load_trained(step_dir, args.checkpoint)
    if settings is None:
        from tidal.train.hf_export import export_hf

        out = args.out or f"{model.step_id}-hf"
        record = export_hf(model, out)
        print(f"exported {model.step_id} checkpoint {model.checkpoint_step} (root {model.checkpoint_root_hash[:12]}) "
              f"as {len(record['tensors'])} tensors to {out} in {time.perf_counter() - started:.1f} s")
        return 0
    from tidal.train.sample import sample

    result = sample(model, args.prompt, settings)
    if args.json:
        print(json.dumps({"text": result.text, "completion": result.completion, "prompt_ids": result.prompt_ids,
                          "new_ids": result.new_ids, "stopped_at_eos": result.stopped_at_eos,
                          "settings": vars(settings)}, indent=1, sort_keys=True))
    else:
        print(result.text)
    return 0
