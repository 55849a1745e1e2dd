"""The near-duplicate settings of a clean step (``clean.near_dedup``): light (pydantic only), so
the recipe, the clean config and the Beam near-dedup stage (:mod:`tidal.data.neardup`) share it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator
from pydantic import Strict as StrictType

from tidal.config import PositiveInt, Strict

# Most MinHash permutations (bands * rows) a recipe may ask for. Time and memory are linear in
# it: each permutation is an affine map over every shingle of every document, and
# tidal/data/minhash.py holds a chunk of 4,096 shingles x permutations uint32 values at once
# (1.8 MB at 112 permutations, 17 MB at 1024, 13 GB at `bands: 100000` x 8); each of the
# `bands` bands is one bucket record per document in the LSH shuffle. FineWeb (Penedo et al.
# 2024, §3.3) and datatrove's MinhashConfig default use 14 bands x 8 rows = 112; 1024 leaves
# 9x that for stricter S-curves while refusing settings that cannot run.
MAX_MINHASH_PERMUTATIONS = 1024


class NearDupConfig(Strict):
    """MinHash + LSH near-duplicate removal with exact Jaccard verification (:mod:`tidal.data.neardup`;
    defaults: FineWeb, see that module's docstring).

    ``bands * rows`` (the MinHash permutations) is at most :data:`MAX_MINHASH_PERMUTATIONS`.
    """

    enabled: bool = Field(default=False, description="exact dedup always runs; this adds near-duplicates")
    shingle_size: PositiveInt = Field(default=5, description="words per shingle (characters for CJK)")
    bands: PositiveInt = Field(default=14, description="LSH bands")
    rows: PositiveInt = Field(default=8, description="MinHash values per band (permutations = bands * rows)")
    jaccard_threshold: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        default=0.75, description="verified Jaccard similarity at or above which documents are duplicates"
    )
    seed: Annotated[int, StrictType(), Field(ge=0)] = Field(
        default=1, description="MinHash permutation seed (datasketch MinHash(seed=...))"
    )
    max_bucket_size: PositiveInt = Field(default=64, description="larger LSH buckets give a star of pairs")

    @model_validator(mode="after")
    def _permutations_bounded(self) -> NearDupConfig:
        permutations = self.bands * self.rows
        if permutations > MAX_MINHASH_PERMUTATIONS:
            raise ValueError(
                f"bands * rows = {self.bands} * {self.rows} = {permutations} MinHash permutations exceeds "
                f"{MAX_MINHASH_PERMUTATIONS}: every permutation is hashed over every shingle of every document "
                "and every band adds one bucket record per document to the shuffle; FineWeb and datatrove "
                "use 14 x 8 = 112")
        return self

    @property
    def num_perm(self) -> int:
        """MinHash permutations: ``bands * rows``."""
        return self.bands * self.rows
