"""Training data of a load-time mixture: each position's sequence read in place from its tokenize step.

The mix step of a ``mixture.load_time`` recipe writes ``mixture.json`` with an index and no tokens
(:mod:`tidal.data.mix_load_time`). :class:`MixedShards` reads it and opens every source's tokenize step
(:class:`tidal.train.loader.TokenShards`, in place: memory maps or ranged GETs); position ``p`` of the
training stream is row ``locate(p)`` of its source (:class:`tidal.data.mixture_index.MixtureIndex`).
The stream is already in training order (stages run in it), so the loader reads positions in order
(``ordered``) instead of shuffling them again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tidal.data.mix_sizing import MixtureError
from tidal.data.mixture_index import MixtureIndex
from tidal.files.step_files import StepFiles
from tidal.train.loader import DataContractError, TokenShards

MIXTURE_FILE = "mixture.json"


def is_load_time(files: StepFiles) -> bool:
    """True when the step's ``mixture.json`` is a load-time mixture's (it has ``load_time``)."""
    if not files.exists(MIXTURE_FILE):
        return False
    return "load_time" in files.read_json(MIXTURE_FILE)


class MixedShards:
    """A load-time mixture, read like :class:`TokenShards` by :class:`tidal.train.loader.BatchLoader`.

    Args:
        files: the mix step.
        where: step name -> its files (the train step's inputs); each source's tokenize step must be among them.
        tokenizer_hash, tokenizer_dir: the model's tokenizer (every source must have been tokenized with it).

    Attributes:
        seq_len, n_sequences (the mixture's size ``N``; positions past it keep drawing from the last stage),
        tokenizer_hash, directory, meta_path, remote, ordered (True), index, sources ({name: TokenShards}).

    Raises:
        DataContractError: ``mixture.json`` unreadable or its index malformed; a source's tokenize step has a
            different number of sequences than the index was built for (it was not the step mixed).
        ConfigError: a source's tokenize step is not among the inputs (from ``where``).
    """

    ordered = True

    def __init__(self, files: StepFiles, where: Callable[[str], StepFiles], *, tokenizer_hash: str,
                 tokenizer_dir: str = "?"):
        self.files, self.directory, self.meta_path = files, files.uri, files.uri_of(MIXTURE_FILE)
        meta = files.read_json(MIXTURE_FILE)
        try:
            load_time, names = meta["load_time"], list(meta["sources"])
            self.index = MixtureIndex.from_json(load_time["index"], names)
            inputs = {src: load_time["inputs"][src] for src in names}
        except (KeyError, TypeError, MixtureError) as err:
            raise DataContractError(f"{self.meta_path}: not a load-time mixture index ({err})") from None
        self.sources = {src: TokenShards(where(step), tokenizer_hash=tokenizer_hash, tokenizer_dir=tokenizer_dir)
                        for src, step in inputs.items()}
        for i, (src, shards) in enumerate(self.sources.items()):
            if shards.n_sequences != int(self.index.available[i]):
                raise DataContractError(
                    f"{shards.directory}: {shards.n_sequences:,} sequences, but {self.meta_path} indexes "
                    f"{int(self.index.available[i]):,} of source {src!r}; rule: a mixture reads the steps it mixed")
        first = next(iter(self.sources.values()))
        self.seq_len, self.tokenizer_hash = first.seq_len, tokenizer_hash
        self.n_sequences = int(meta["n_sequences"])
        self.remote = any(s.remote for s in self.sources.values())
        self.shards: list[Any] = first.shards  # their dtype sizes a row (the loader's block reads refuse ordered data)

    def locate(self, position: int) -> tuple[str, int]:
        """(shard location, row) of the sequence at stream ``position`` (divergence reports name it)."""
        src, row = self.index.locate(np.array([position], dtype=np.int64))
        return list(self.sources.values())[int(src[0])].locate(int(row[0]))

    def rows(self, positions: np.ndarray, vocab_size: int | None = None) -> np.ndarray:
        """Sequences at stream ``positions`` (``[n]`` ints ``>= 0``): ``[n, seq_len]`` int32, in order.

        Raises:
            DataContractError: a token id ``>= vocab_size`` (names the source's shard file and row).
        """
        src, rows = self.index.locate(np.asarray(positions, dtype=np.int64))
        out = np.empty((len(src), self.seq_len), dtype=np.int32)
        for i, shards in enumerate(self.sources.values()):
            here = np.nonzero(src == i)[0]
            if here.size:
                out[here] = shards.rows(rows[here], vocab_size)
        return out
