"""Near-duplicate detection: MinHash + LSH banding, exact Jaccard verification, star clustering.

Invariant: which documents are near-duplicates, and which one of each cluster survives,
is a pure function of the set of documents (their text and ref) and the config, never of
worker count, bundle boundaries or shard order. Every step below is keyed and sorted:

1. Shingles (:func:`shingles`): word n-grams of ``shingle_size`` words over
   :func:`tidal.data.filters.words`, so CJK text (a word per character) gets character
   n-grams. A document with fewer words than ``shingle_size`` gets exactly one shingle, its
   whole word sequence, on purpose: two short documents then match only if their word
   sequences are equal (Jaccard 1), and a short document never matches a long one.
2. MinHash signature (Broder 1997, "On the resemblance and containment of documents") of
   ``bands * rows`` permutations: datasketch's ``affine32`` MinHash with its seeded
   permutations, computed a batch of documents at a time (:mod:`tidal.data.minhash`).
3. LSH banding (Leskovec, Rajaraman & Ullman, "Mining of Massive Datasets", ch. 3.4):
   the signature is cut into ``bands`` bands of ``rows`` values; each band's values hash
   (blake2b, 8 bytes) to a bucket key ``band:hex``. Documents sharing any bucket are
   candidates. Defaults 14 bands x 8 rows = 112 permutations, 5-word shingles and a 0.75
   Jaccard threshold are FineWeb's (Penedo et al. 2024, "The FineWeb Datasets", §3.3);
   the S-curve ``1 - (1 - s^8)^14`` is 0.5 at s ~ 0.72 and 0.96 at s = 0.8.
4. Candidate pairs: every pair in a bucket, ordered by id; a bucket with more than
   ``max_bucket_size`` members contributes only the pairs (lowest id, other) (a star), so a
   huge bucket cannot blow up quadratically. Pairs are de-duplicated.
5. Verification: the exact Jaccard similarity of the two shingle sets; only pairs with
   ``J >= jaccard_threshold`` become edges. LSH only proposes; nothing is merged unchecked.
6. Clustering (:func:`star_clusters`): documents in survivor order (lowest ref by
   :func:`tidal.data.sources.ref_sort_key`, then lowest id); each document not yet assigned
   becomes a cluster centre (it is kept) and takes every unassigned document with a
   verified edge *to it*. So every removed document was checked against the very document
   that replaced it: a chain A~B~C with A !~ C removes B (into A) and keeps C.

Only documents that are in some candidate pair travel to the two verification joins (the
set of their ids is a side input, as is the set of removed ids where the clean step applies
the result), so the full text crosses one shuffle less for the great majority of documents
that have no near-duplicate. The clustering step collects the verified edges on one worker:
edges exist only between near-duplicates, a small fraction of a corpus. At web scale (ids
of hundreds of millions of candidates) the two side inputs become joins and the clustering a
distributed connected-components pass (losing the per-edge guarantee of the star rule).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np

from tidal.data.filters import words
from tidal.data.minhash import shingle_hashes, signatures
from tidal.data.sources import ref_sort_key

SHINGLE_JOIN = "\x1f"  # ASCII unit separator: cannot occur inside a normalized word
PAIR_COUNTS = "pair_counts"


@dataclass(frozen=True)
class NearDupConfig:
    """Near-duplicate settings (defaults: FineWeb, see the module docstring).

    Attributes:
        enabled: run near-duplicate detection (exact dedup always runs).
        shingle_size: words per shingle (characters for CJK text), >= 1.
        bands: LSH bands, >= 1.
        rows: MinHash values per band, >= 1 (permutations = bands * rows).
        jaccard_threshold: verified similarity at or above which two documents are duplicates.
        seed: seed of the MinHash permutations (datasketch ``MinHash(seed=...)``).
        max_bucket_size: above this many members a bucket yields a star of pairs, not all pairs.
    """

    enabled: bool = False
    shingle_size: int = 5
    bands: int = 14
    rows: int = 8
    jaccard_threshold: float = 0.75
    seed: int = 1
    max_bucket_size: int = 64

    @classmethod
    def from_config(cls, values: dict[str, Any] | None) -> NearDupConfig:
        """From a config mapping (missing keys: defaults; ``None``: disabled).

        Raises:
            ValueError: naming an unknown key or a value out of range.
        """
        values = dict(values or {})
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"near_dedup: unknown key(s) {unknown}; known {sorted(cls.__dataclass_fields__)}")
        out = cls(**values)
        if not isinstance(out.enabled, bool):
            raise ValueError(f"near_dedup 'enabled' must be true or false, got {out.enabled!r}")  # noqa: TRY004
        for key in ("shingle_size", "bands", "rows", "max_bucket_size"):
            value = getattr(out, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"near_dedup {key!r} must be an integer >= 1, got {value!r}")
        if isinstance(out.seed, bool) or not isinstance(out.seed, int) or out.seed < 0:
            raise ValueError(f"near_dedup 'seed' must be an integer >= 0, got {out.seed!r}")
        t = out.jaccard_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1:
            raise ValueError(f"near_dedup 'jaccard_threshold' must be in (0, 1], got {t!r}")
        return out

    @property
    def num_perm(self) -> int:
        """MinHash permutations: ``bands * rows``."""
        return self.bands * self.rows


def shingles(text: str, size: int) -> frozenset[str]:
    """The shingle set of ``text``: ``size``-word n-grams joined by U+001F (see module docstring).

    Empty text has no shingle; text with fewer than ``size`` words has one, all its words.
    """
    doc_words = words(text)
    if not doc_words:
        return frozenset()
    if len(doc_words) < size:
        return frozenset([SHINGLE_JOIN.join(doc_words)])
    return frozenset(SHINGLE_JOIN.join(doc_words[i : i + size]) for i in range(len(doc_words) - size + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b|; 0.0 when both are empty."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def signature(text: str, cfg: NearDupConfig) -> np.ndarray:
    """MinHash signature of one document, 1-D ``uint32[cfg.num_perm]`` (:mod:`tidal.data.minhash`)."""
    return signature_batch([text], cfg)[0]


def signature_batch(texts: Sequence[str], cfg: NearDupConfig) -> np.ndarray:
    """MinHash signatures of a batch of documents, ``uint32[len(texts), cfg.num_perm]``
    (:mod:`tidal.data.minhash`; shingles as :func:`shingles`)."""
    hashes, counts = shingle_hashes([words(t) for t in texts], cfg.shingle_size)
    return signatures(hashes, counts, cfg.num_perm, cfg.seed)


def band_keys(sig: np.ndarray, cfg: NearDupConfig) -> list[str]:
    """One bucket key per band: ``"{band}:{blake2b-64 of the band's little-endian uint32 values}"``."""
    values = np.asarray(sig, dtype="<u4")
    return [
        f"{b}:{hashlib.blake2b(values[b * cfg.rows : (b + 1) * cfg.rows].tobytes(), digest_size=8).hexdigest()}"
        for b in range(cfg.bands)
    ]


def bucket_pairs(members: Iterable[str], max_bucket_size: int) -> list[tuple[str, str]]:
    """Candidate pairs ``(lower id, higher id)`` of one bucket (see module docstring, step 4)."""
    ids = sorted(set(members))
    if len(ids) > max_bucket_size:
        return [(ids[0], other) for other in ids[1:]]
    return [(ids[i], ids[j]) for i in range(len(ids)) for j in range(i + 1, len(ids))]


def star_clusters(edges: Iterable[tuple[str, str, str, str, float]]) -> dict[str, tuple[str, float]]:
    """Star clustering over verified edges ``(id_a, ref_a, id_b, ref_b, jaccard)``.

    Returns:
        ``{removed id: (survivor id, jaccard to the survivor)}``; documents not in it are
        kept (module docstring, step 6).
    """
    refs: dict[str, str] = {}
    neighbours: dict[str, dict[str, float]] = defaultdict(dict)
    for id_a, ref_a, id_b, ref_b, sim in edges:
        refs[id_a], refs[id_b] = ref_a, ref_b
        neighbours[id_a][id_b] = sim
        neighbours[id_b][id_a] = sim
    order = sorted(refs, key=lambda i: (ref_sort_key(refs[i]), i))
    rank = {doc_id: n for n, doc_id in enumerate(order)}
    assigned: set[str] = set()
    removed: dict[str, tuple[str, float]] = {}
    for centre in order:
        if centre in assigned:
            continue
        assigned.add(centre)
        for other in sorted(neighbours[centre], key=rank.__getitem__):
            if other not in assigned:
                assigned.add(other)
                removed[other] = (centre, neighbours[centre][other])
    return removed


# ---------------------------------------------------------------- Beam

BUCKET_PARTITIONS = 16  # shuffle keys of the bucket stage; any value gives the same result


def band_entries(docs: Iterable[tuple[str, str, str]], cfg: NearDupConfig,
                 partitions: int = BUCKET_PARTITIONS) -> dict[int, list[tuple[str, str, str]]]:
    """Bucket entries of a batch of ``(id, ref, text)`` documents, grouped for the shuffle.

    Returns:
        ``{partition: [(bucket key, id, ref), ...]}``, ``bands`` entries per document with
        at least one shingle; a bucket's entries all land in one partition (the key's
        hash, mod ``partitions``), so buckets can be completed per partition. Exact
        duplicates (same id) give the same entries with their own refs.
    """
    docs = list(docs)
    doc_words = [words(text) for _, _, text in docs]
    hashes, counts = shingle_hashes(doc_words, cfg.shingle_size)
    sigs = signatures(hashes, counts, cfg.num_perm, cfg.seed)
    out: dict[int, list[tuple[str, str, str]]] = defaultdict(list)
    for (doc_id, ref, _), sig, n in zip(docs, sigs, counts, strict=True):
        if not n:
            continue
        for key in band_keys(sig, cfg):
            out[int(key[-4:], 16) % partitions].append((key, doc_id, ref))
    return dict(out)


def partition_pairs(entries: Iterable[tuple[str, str, str]], max_bucket_size: int) -> list[tuple[str, str, str, str]]:
    """Candidate pairs of one partition's bucket entries ``(bucket key, id, ref)``.

    Within a bucket, each id keeps its lowest ref (:func:`tidal.data.sources.ref_sort_key`,
    the exact-dedup survivor's), then :func:`bucket_pairs` proposes pairs.

    Returns:
        Sorted distinct ``(id_a, ref_a, id_b, ref_b)`` with ``id_a < id_b``.
    """
    buckets: dict[str, dict[str, str]] = defaultdict(dict)
    for key, doc_id, ref in entries:
        members = buckets[key]
        if doc_id not in members or ref_sort_key(ref) < ref_sort_key(members[doc_id]):
            members[doc_id] = ref
    pairs: set[tuple[str, str, str, str]] = set()
    for members in buckets.values():
        if len(members) < 2:
            continue
        for id_a, id_b in bucket_pairs(members, max_bucket_size):
            pairs.add((id_a, members[id_a], id_b, members[id_b]))
    return sorted(pairs)


def _lowest_refs(pairs: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    """All partitions' pairs, distinct per id pair with each id's lowest ref (sorted)."""
    refs: dict[str, str] = {}
    for id_a, ref_a, id_b, ref_b in pairs:
        for doc_id, ref in ((id_a, ref_a), (id_b, ref_b)):
            if doc_id not in refs or ref_sort_key(ref) < ref_sort_key(refs[doc_id]):
                refs[doc_id] = ref
    return sorted({(a, refs[a], b, refs[b]) for a, _, b, _ in pairs})


def _candidate_texts(batch, ids):
    """A batch of :class:`tidal.data.clean_record.Document` -> ``(id, text)`` of candidates."""
    for doc in batch:
        if doc.id in ids:
            yield doc.id, doc.text


def _attach_first(element):
    """``(id_a, {"text": [text_a...], "pair": [(ref_a, id_b, ref_b)...]})`` -> ``(id_b, (id_a, ref_a,
    text_a, ref_b))``."""
    id_a, grouped = element
    texts = list(grouped["text"])
    if not texts:
        return
    for ref_a, id_b, ref_b in grouped["pair"]:
        yield id_b, (id_a, ref_a, texts[0], ref_b)


class _VerifyFn(beam.DoFn):
    """``(id_b, {"text": [text_b...], "pair": [(id_a, ref_a, text_a, ref_b)...]})`` -> verified edges
    ``(id_a, ref_a, id_b, ref_b, jaccard)``; pair counts on the ``pair_counts`` output."""

    def __init__(self, cfg: NearDupConfig):
        self.cfg = cfg

    def process(self, element):
        id_b, grouped = element
        texts = list(grouped["text"])
        pairs = list(grouped["pair"])
        if not texts or not pairs:
            return
        shingles_b = shingles(texts[0], self.cfg.shingle_size)
        verified = 0
        for id_a, ref_a, text_a, ref_b in pairs:
            sim = jaccard(shingles(text_a, self.cfg.shingle_size), shingles_b)
            if sim >= self.cfg.jaccard_threshold:
                verified += 1
                yield id_a, ref_a, id_b, ref_b, round(sim, 6)
        beam.metrics.Metrics.counter("tidal.clean", "neardup.candidate_pairs").inc(len(pairs))
        yield beam.pvalue.TaggedOutput(PAIR_COUNTS, ("neardup.candidate_pairs", len(pairs)))
        if verified:
            beam.metrics.Metrics.counter("tidal.clean", "neardup.verified_pairs").inc(verified)
            yield beam.pvalue.TaggedOutput(PAIR_COUNTS, ("neardup.verified_pairs", verified))


class NearDuplicates(beam.PTransform):
    """Batches of documents -> ``(removed, pair_counts)``.

    Input: a PCollection of lists of :class:`tidal.data.clean_record.Document` (exact
    duplicates included: they collapse onto their id, with the lowest ref). Output:
    ``removed``, ``(removed id, (survivor id, jaccard))`` (module docstring), and
    ``pair_counts``, ``("neardup.candidate_pairs" | "neardup.verified_pairs", n)`` (also Beam
    counters of namespace ``tidal.clean``).
    """

    def __init__(self, cfg: NearDupConfig):
        super().__init__()
        self.cfg = cfg

    def expand(self, batches):
        cfg = self.cfg
        pairs = (
            batches
            | "BandEntries" >> beam.FlatMap(lambda b: band_entries(((d.id, d.ref, d.text) for d in b), cfg).items())
            | "GroupPartitions" >> beam.GroupByKey()
            | "PartitionPairs" >> beam.Map(
                lambda kv: partition_pairs((e for chunk in kv[1] for e in chunk), cfg.max_bucket_size))
            | "AllPairs" >> beam.CombineGlobally(lambda lists: [p for chunk in lists for p in chunk])
            | "LowestRefs" >> beam.FlatMap(_lowest_refs)
        )
        # only candidate documents' texts travel to the verification joins
        candidate_ids = pairs | "PairMembers" >> beam.FlatMap(lambda p: [p[0], p[2]])
        texts = (
            batches
            | "CandidateTexts" >> beam.FlatMap(
                _candidate_texts, ids=beam.pvalue.AsDict(candidate_ids | "AsKeys" >> beam.Map(lambda i: (i, None))))
        )
        first = (
            {"text": texts, "pair": pairs | "ByFirst" >> beam.Map(lambda p: (p[0], (p[1], p[2], p[3])))}
            | "JoinFirst" >> beam.CoGroupByKey()
            | "AttachFirst" >> beam.FlatMap(_attach_first)
        )
        verified = (
            {"text": texts, "pair": first}
            | "JoinSecond" >> beam.CoGroupByKey()
            | "Verify" >> beam.ParDo(_VerifyFn(cfg)).with_outputs(PAIR_COUNTS, main="edges")
        )
        removed = (
            verified.edges
            | "AllEdges" >> beam.combiners.ToList()
            | "StarClusters" >> beam.FlatMap(lambda e: sorted(star_clusters(e).items()))
        )
        return removed, verified[PAIR_COUNTS]
