"""A committed train step's model, read back for use: its config, tokenizer and the parameters of one
verified checkpoint (``tidal export``, ``tidal sample``).

The checkpoint is restored by the trainer's own path (:meth:`tidal.train.checkpoints.Checkpointer.restore`),
into the abstract state the trainer builds from the same ``spec.json`` (model shape from the config and
the tokenizer's vocabulary size, AdamW state from the optimizer config), after its files are checked
against its manifest. Nothing in the step directory is written. The final checkpoint is the one
``summary.json`` names (``checkpoint_step``, ``checkpoint_root_hash``); an older kept one can be asked for.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tidal.storage.layout import SPEC_JSON, SUMMARY_JSON
from tidal.train.config import ConfigError, TrainStepConfig, parse_step_config
from tidal.train.loader import read_tokenizer_meta
from tidal.train.model import ModelShape, Transformer, init_params
from tidal.train.optimizer import make_optimizer

TOKENIZER_FILE = "tokenizer.json"


@dataclass
class TrainedModel:
    """One checkpoint of a committed train step.

    Attributes:
        step_dir: the train step's directory; ``step_id`` its name.
        config: its :class:`TrainStepConfig`; ``shape`` the model's :class:`ModelShape`.
        params: the flax parameter pytree (float32 host arrays).
        checkpoint_step: completed updates of the checkpoint; ``checkpoint_root_hash`` its manifest's root hash.
        tokenizer_dir: the tokenizer step's directory (``tokenizer.json``); ``tokenizer_meta`` its meta
            (``tokenizer_hash``, ``vocab_size``, ``eos_id``, ``special_tokens``).
        context: tokens per training input (``seq_len - 1`` of the mixture), None when the mixture is gone.
    """

    step_dir: Path
    step_id: str
    config: TrainStepConfig
    shape: ModelShape
    params: Any
    checkpoint_step: int
    checkpoint_root_hash: str
    tokenizer_dir: Path
    tokenizer_meta: dict[str, Any]
    context: int | None

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        """tidal's own forward pass: token ids ``[B, T]`` -> float32 logits ``[B, T, V]`` (numpy)."""
        return np.asarray(_forward(self.shape)(self.params, jnp.asarray(tokens, jnp.int32)), np.float32)


_FORWARDS: dict[str, Any] = {}


def _forward(shape: ModelShape) -> Any:
    """The jitted ``Transformer(shape).apply`` (one per shape; MoE statistics are not collected)."""
    key = shape.model_dump_json()
    if key not in _FORWARDS:
        model = Transformer(shape)
        _FORWARDS[key] = jax.jit(lambda params, tokens: model.apply({"params": params}, tokens).astype(jnp.float32))
    return _FORWARDS[key]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing; a train step directory holds {SPEC_JSON} and {SUMMARY_JSON}") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: unreadable: {err}") from None


def _context(spec: dict[str, Any], cfg: TrainStepConfig) -> int | None:
    """``seq_len - 1`` from the mixture's ``mixture.json`` (None when it cannot be read)."""
    where = (spec.get("inputs") or {}).get(cfg.train_data)
    try:
        seq_len = json.loads((Path(where) / "mixture.json").read_text())["seq_len"]
    except (TypeError, OSError, ValueError, KeyError):
        return None
    return int(seq_len) - 1 if isinstance(seq_len, int) else None


def load_trained(step_dir: str | Path, checkpoint: int | None = None,
                 tokenizer_dir: str | Path | None = None) -> TrainedModel:
    """Read the model of the train step in ``step_dir`` from a verified checkpoint.

    Args:
        step_dir: a committed train step's directory (``spec.json``, ``summary.json``, ``checkpoints/``).
        checkpoint: the checkpoint's step; None: the final one (``summary.json`` ``checkpoint_step``).
        tokenizer_dir: a local copy of the train step's tokenizer step (a reader that resolved its own
            inputs, e.g. the eval step); None: the directory ``spec.json`` records, which must be local.

    Raises:
        ConfigError: not a train step, its config or tokenizer unreadable, the checkpoint missing,
            failing its manifest, or (the final one) another root hash than ``summary.json`` records;
            every message names the file.
        CheckpointMismatch: the checkpoint does not fit the model its config describes.
    """
    from tidal.train.checkpoints import Checkpointer

    step_dir = Path(step_dir).resolve()
    spec = _read_json(step_dir / SPEC_JSON)
    if spec.get("kind") != "train":
        raise ConfigError(f"{step_dir / SPEC_JSON}: kind {spec.get('kind')!r}; only a train step has a model")
    summary = _read_json(step_dir / SUMMARY_JSON)
    cfg = parse_step_config(spec.get("config"), step_dir / SPEC_JSON)
    tok = tokenizer_dir if tokenizer_dir is not None else (spec.get("inputs") or {}).get(cfg.tokenizer)
    if tok is None or "://" in str(tok):
        raise ConfigError(f"{step_dir / SPEC_JSON}: inputs.{cfg.tokenizer}: the tokenizer step must be a local "
                          f"directory (got {tok!r})")
    tokenizer_dir = Path(tok)
    meta = read_tokenizer_meta(tokenizer_dir)
    try:
        shape = cfg.model.shape(int(meta["vocab_size"]))
    except ValueError as err:
        raise ConfigError(f"{step_dir / SPEC_JSON}: config.model: {err}") from None
    tx, _ = make_optimizer(cfg.optimizer, cfg.steps)  # only the state's structure matters, not the schedule

    def init(key):
        params = init_params(shape, key, 8)
        return {"params": params, "opt_state": tx.init(params)}

    abstract = jax.eval_shape(init, jax.random.key(0))
    want = int(summary["checkpoint_step"]) if checkpoint is None else int(checkpoint)
    ckpt = Checkpointer(step_dir, keep=1, log=logging.getLogger("tidal.train.trained"), async_save=False,
                        primary=False, read_only=True)  # a committed step: nothing written there
    try:
        where = ckpt.path(want)
        if want not in ckpt.steps():
            raise ConfigError(f"{where}: no such checkpoint; kept: {ckpt.steps() or 'none'}")
        problems = ckpt.problems(want)
        if problems:
            raise ConfigError(f"{where}: fails verification: {'; '.join(problems[:3])}; rule: a checkpoint is "
                              "read only when every file matches its manifest")
        state, manifest = ckpt.restore(want, abstract)
    finally:
        ckpt.close()
    if checkpoint is None and manifest.get("root_hash") != summary.get("checkpoint_root_hash"):
        raise ConfigError(f"{where}: manifest root hash {manifest.get('root_hash')} is not the "
                          f"{summary.get('checkpoint_root_hash')} that {step_dir / SUMMARY_JSON} records")
    params = jax.tree.map(lambda leaf: np.asarray(jax.device_get(leaf)), state["params"])
    return TrainedModel(step_dir, step_dir.name, cfg, shape, params, want, str(manifest["root_hash"]),
                        tokenizer_dir, meta, _context(spec, cfg))
