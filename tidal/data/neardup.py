"""Near-duplicate detection: MinHash + LSH banding, exact Jaccard verification, star clustering.

Invariant: which documents are near-duplicates, and which one of each cluster survives,
is a pure function of the set of documents (their text and ref) and the config, never of
worker count, bundle boundaries or shard order. Every step below is keyed and sorted:

1. Shingles (:func:`shingles`): word n-grams of ``shingle_size`` words of the *folded* text
   (:func:`shingle_words`: NFKC, case-folded, punctuation and underscores removed, whitespace runs
   as one, as datatrove and the MinHash dedup literature normalize before shingling), split by
   :func:`tidal.data.filters.words`, so CJK text (a word per character) gets character n-grams
   and a copy with its words upper-cased or its punctuation changed has the original's shingles.
   A document with fewer words than ``shingle_size`` gets exactly one shingle, its whole word
   sequence, on purpose: two short documents then match only if their word sequences are equal
   (Jaccard 1), and a short document never matches a long one.
2. MinHash signature (Broder 1997, "On the resemblance and containment of documents") of
   ``bands * rows`` permutations: datasketch's ``affine32`` MinHash with its seeded
   permutations, computed a batch of documents at a time (:mod:`tidal.data.minhash`).
3. LSH banding (Leskovec, Rajaraman & Ullman, "Mining of Massive Datasets", ch. 3.4):
   the signature is cut into ``bands`` bands of ``rows`` values; each band's index and
   values hash to a 64-bit bucket key (:func:`band_keys`). Documents sharing any bucket are
   candidates. Defaults 14 bands x 8 rows = 112 permutations, 5-word shingles and a 0.75
   Jaccard threshold are FineWeb's (Penedo et al. 2024, "The FineWeb Datasets", §3.3);
   the S-curve ``1 - (1 - s^8)^14`` is 0.5 at s ~ 0.685, 0.65 at s = 0.72 and 0.92 at s = 0.8.
4. Candidate pairs: every pair in a bucket, ordered by id; a bucket with more than
   ``max_bucket_size`` members contributes only the pairs (survivor, other) (a star from the member
   first in survivor order, step 6, so the document that survives is checked against all), so a
   huge bucket cannot blow up quadratically (templated pages sharing most shingles, datatrove issue
   222); such buckets and the pairs they did not propose are counted (``neardup.oversized_buckets``,
   ``neardup.pairs_not_proposed`` in ``counts.json``). Exact copies share an id, so thousands of
   identical documents are one member. Pairs are de-duplicated.
5. Verification: the exact Jaccard similarity of the two shingle sets; only pairs with
   ``J >= jaccard_threshold`` become edges. LSH only proposes; nothing is merged unchecked.
6. Clustering (:func:`tidal.data.neardup_clusters.star_clusters`): documents in survivor order (lowest ref by
   :func:`tidal.data.sources.ref_sort_key`, then lowest id); each document not yet assigned
   becomes a cluster centre (it is kept) and takes every unassigned document with a
   verified edge *to it*. So every removed document was checked against the very document
   that replaced it: a chain A~B~C with A !~ C removes B (into A) and keeps C.

Only documents that are in some candidate pair travel to the verification join: the bucket
entries say where each document waits in its batch's spill file, so a candidate's place comes
out of the bucket stage with its pairs, and the texts of the great majority of documents, which
have no near-duplicate, stay in their spill files and cross no shuffle; a candidate's text (of its
copy with the lowest ref: exact copies share it) is read once and sent to its own id and to each
partner's (the ``GroupPairs`` shuffle). Every stage is keyed (by bucket partition, document or
spill file): no side input, no single key.
The clustering runs per connected component of the verified edges
(:class:`tidal.data.neardup_clusters.Clusters`: Hash-to-Min rounds keyed by document, then the star rule
on each component), which gives exactly the survivors of one star pass over every edge, with no worker
holding more than one component.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence

import apache_beam as beam
import numpy as np

from tidal.data.beam_options import one_worker
from tidal.data.filters import words
from tidal.data.minhash import fmix64, shingle_hashes, signatures
from tidal.data.neardup_clusters import CLUSTER_ROUNDS, Clusters
from tidal.data.neardup_config import NearDupConfig
from tidal.data.sources import ref_sort_key
from tidal.data.spill import docs_path_of, read_bands, read_texts

SHINGLE_JOIN = "\x1f"  # ASCII unit separator: cannot occur inside a normalized word
PAIR_COUNTS = "pair_counts"
_ASCII_PUNCT = str.maketrans("", "", string.punctuation)  # ASCII punctuation, underscore included
_PUNCT_RE = re.compile(r"[^\w\s]|_")  # anything not a letter, digit or mark, nor whitespace


def fold_text(text: str) -> str:
    """Text as near-duplicate detection compares it: NFKC (full-width forms, ligatures), case-folded,
    punctuation, symbols and ``_`` removed (``"Don't STOP, now_."`` -> ``"dont stop now"``; words keep
    their digits). ASCII text takes a fast path with the same result. Source of the choice: datatrove's
    ``simplify_text`` (lower case, punctuation removed, whitespace normalized) before its MinHash
    shingles, and Broder's resemblance over canonicalized text."""
    if text.isascii():
        return text.lower().translate(_ASCII_PUNCT)
    return _PUNCT_RE.sub("", unicodedata.normalize("NFKC", text).casefold())


def shingle_words(text: str) -> list[str]:
    """The words shingles are made of: :func:`tidal.data.filters.words` of :func:`fold_text`."""
    return words(fold_text(text))


def shingles(text: str, size: int) -> frozenset[str]:
    """The shingle set of ``text``: ``size``-word n-grams joined by U+001F (see module docstring).

    Empty text has no shingle; text with fewer than ``size`` words has one, all its words.
    """
    doc_words = shingle_words(text)
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
    hashes, counts = shingle_hashes((shingle_words(t) for t in texts), cfg.shingle_size)
    return signatures(hashes, counts, cfg.num_perm, cfg.seed)


def band_keys(sigs: np.ndarray, cfg: NearDupConfig) -> np.ndarray:
    """Bucket keys: one 64-bit key per band of each signature (module docstring, step 3).

    Args:
        sigs: ``uint32[n, bands * rows]`` (or one signature, ``uint32[bands * rows]``).

    Returns:
        ``uint64[n, bands]`` (or ``uint64[bands]``): band ``b``'s key mixes ``b`` and the
        band's ``rows`` values (FNV-1a-style multiply-xor over 64 bits, then MurmurHash3's
        ``fmix64``), so equal bands of the same index give equal keys and bands of different
        indexes do not meet; a chance collision (2^-64) only proposes a pair that the
        Jaccard check then rejects.
    """
    sigs = np.asarray(sigs, dtype=np.uint32)
    single = sigs.ndim == 1
    sigs = np.atleast_2d(sigs).astype(np.uint64)
    keys = np.empty((sigs.shape[0], cfg.bands), dtype=np.uint64)
    for band in range(cfg.bands):
        h = np.full(sigs.shape[0], np.uint64(0xCBF29CE484222325) ^ np.uint64(band), dtype=np.uint64)
        for j in range(band * cfg.rows, (band + 1) * cfg.rows):
            h = (h ^ sigs[:, j]) * _FNV_PRIME
        keys[:, band] = fmix64(h)
    return keys[0] if single else keys


def pairs_not_proposed(size: int, max_bucket_size: int) -> int:
    """Pairs a bucket of ``size`` distinct ids does not propose because it is over the cap: all
    ``size * (size - 1) / 2`` pairs minus the star's ``size - 1`` (0 within the cap)."""
    return size * (size - 1) // 2 - (size - 1) if size > max_bucket_size else 0


def bucket_pairs(members: dict[str, str], max_bucket_size: int) -> list[tuple[str, str]]:
    """Candidate pairs ``(lower id, higher id)`` of one bucket (see module docstring, step 4).

    Args:
        members: the bucket's distinct ids, each with its lowest ref. A bucket over ``max_bucket_size``
            gives the star of pairs from its survivor, the member first in survivor order (lowest ref by
            :func:`tidal.data.sources.ref_sort_key`, then id), to every other: the survivor is then
            checked against every member and takes each it verifies, whatever the corpus's size.
    """
    ids = sorted(members)
    if len(ids) > max_bucket_size:
        centre = min(ids, key=lambda i: (ref_sort_key(members[i]), i))
        return sorted((min(centre, other), max(centre, other)) for other in ids if other != centre)
    return [(ids[i], ids[j]) for i in range(len(ids)) for j in range(i + 1, len(ids))]


# ---------------------------------------------------------------- Beam

BUCKET_PARTITIONS = 16  # shuffle keys of the bucket stage; any value gives the same result
_FNV_PRIME = np.uint64(0x100000001B3)


def band_entries(docs: Iterable[tuple[str, str, str, int, int]], cfg: NearDupConfig,
                 partitions: int = BUCKET_PARTITIONS) -> dict[int, tuple[np.ndarray, ...]]:
    """Bucket entries of a batch of ``(id, ref, text, shard, row)`` documents (``shard``, ``row``: where the
    batch's spill file of that shard holds the document, :func:`tidal.data.spill.docs_path_of`), grouped
    for the shuffle.

    Returns:
        ``{partition: (keys, members, ids, refs, places)}``: ``keys`` ``uint64[m]`` bucket keys
        (:func:`band_keys`), ``members`` ``int32[m]`` each entry's document as an index into
        ``ids``, the raw 32-byte ids (``uint8[k, 32]``) of the documents with an entry in this
        partition, ``refs`` (``str[k]``) their refs (an oversized bucket's star starts at its
        survivor, :func:`bucket_pairs`) and ``places`` (``int32[k, 2]``) their spill files' shard and
        row (a candidate's text is read from there: no lookup of every document's stub). A bucket's
        entries all land in one partition (``key % partitions``), so
        buckets can be completed per partition. Exact duplicates (same id) give the same keys.
        Compact on purpose: the entries cross a shuffle (about 12 bytes an entry, ``bands``
        entries a document, plus 32 bytes a document per partition it appears in).
    """
    docs = list(docs)
    hashes, counts = shingle_hashes((shingle_words(text) for _, _, text, _, _ in docs), cfg.shingle_size)
    sigs = signatures(hashes, counts, cfg.num_perm, cfg.seed)
    has = np.flatnonzero(counts > 0)
    if not has.size:
        return {}
    # uint8 rows, not numpy "S32": an "S" element loses its trailing zero bytes
    raw_ids = np.frombuffer(b"".join(bytes.fromhex(docs[i][0]) for i in has), dtype=np.uint8).reshape(-1, 32)
    refs = np.array([docs[i][1] for i in has], dtype=np.str_)
    places = np.array([docs[i][3:5] for i in has], dtype=np.int32).reshape(-1, 2)
    keys = band_keys(sigs[has], cfg).reshape(-1)
    members = np.repeat(np.arange(has.size, dtype=np.int64), cfg.bands)
    part = (keys % np.uint64(partitions)).astype(np.int64)
    out = {}
    for p in np.unique(part).tolist():
        mask = part == p
        present, local = np.unique(members[mask], return_inverse=True)
        out[p] = (keys[mask], local.astype(np.int32), raw_ids[present], refs[present], places[present])
    return out


Copy = tuple[str, str, int]  # a document's copy: (ref, spill file, row)


def partition_pairs(chunks: Iterable[tuple[str, tuple[np.ndarray, ...]]], max_bucket_size: int,
                    counts: dict[str, int] | None = None) -> tuple[list[tuple[str, str]], dict[str, Copy]]:
    """Candidate pairs of one partition's bucket entries: each bucket's distinct ids through
    :func:`bucket_pairs`.

    Args:
        chunks: ``(bands file, entries)``, the entries being one partition's value of :func:`band_entries`
            as :func:`tidal.data.spill.read_bands` reads it from that file.
        counts: receives ``neardup.oversized_buckets`` (buckets over ``max_bucket_size``, which gave
            a star) and ``neardup.pairs_not_proposed`` (:func:`pairs_not_proposed`, summed).

    Returns:
        ``(pairs, copies)``: sorted distinct ``(id_a, id_b)`` (hex ids) with ``id_a < id_b``, and for each
        id in a pair its copy with the lowest ref (``(ref, spill file, row)``: every copy of an id has
        the same band keys, so each partition that finds it sees all its copies).
    """
    counts = counts if counts is not None else {}
    keys, members, ids, refs, places, files = [], [], [], [], [], []
    offset = 0
    for bands_file, (chunk_keys, chunk_members, chunk_ids, chunk_refs, chunk_places) in chunks:
        keys.append(chunk_keys)
        members.append(chunk_members.astype(np.int64) + offset)
        ids.append(chunk_ids)
        refs.append(chunk_refs)
        places.append(chunk_places)
        files += [bands_file] * len(chunk_ids)
        offset += len(chunk_ids)
    if not keys:
        return [], {}
    keys, members, ids, refs, places = (np.concatenate(keys), np.concatenate(members), np.concatenate(ids),
                                        np.concatenate(refs), np.concatenate(places))
    order = np.argsort(keys, kind="stable")
    keys, members = keys[order], members[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], keys.size]
    big = ends - starts > 1
    pairs: set[tuple[str, str]] = set()
    lowest: dict[str, tuple[tuple, int]] = {}  # id -> (sort key, entry index) of its lowest-ref copy
    for lo, hi in zip(starts[big].tolist(), ends[big].tolist(), strict=True):
        bucket: dict[str, tuple[tuple, str]] = {}  # id -> (sort key, ref) of its lowest ref in the bucket
        for m in members[lo:hi].tolist():
            doc_id, ref = ids[m].tobytes().hex(), str(refs[m])
            key = ref_sort_key(ref)  # once per entry: this loop runs over every entry of a shared bucket
            rank = (key, ref, files[m], int(places[m, 0]), int(places[m, 1]))
            if doc_id not in lowest or rank < lowest[doc_id][0]:
                lowest[doc_id] = (rank, m)
            if doc_id not in bucket or key < bucket[doc_id][0]:
                bucket[doc_id] = (key, ref)
        if len(bucket) > 1:
            pairs.update(bucket_pairs({doc_id: ref for doc_id, (_, ref) in bucket.items()}, max_bucket_size))
            if len(bucket) > max_bucket_size:
                counts["neardup.oversized_buckets"] = counts.get("neardup.oversized_buckets", 0) + 1
                counts["neardup.pairs_not_proposed"] = (counts.get("neardup.pairs_not_proposed", 0)
                                                        + pairs_not_proposed(len(bucket), max_bucket_size))
    copies = {}
    for doc_id in {i for pair in pairs for i in pair}:
        m = lowest[doc_id][1]
        copies[doc_id] = (str(refs[m]), docs_path_of(files[m], int(places[m, 0])), int(places[m, 1]))
    return sorted(pairs), copies


TEXT, PAIR = "text", "pair"  # the two kinds of values the verification groups (first item)


PARTNER, COPY = "partner", "copy"  # what the candidates' grouping by id receives (first item)


def _partition_candidates(element, max_bucket_size: int):
    """``(partition, [bands file...])`` -> for each candidate pair ``(id_a, ("partner", id_b))``, for each
    candidate ``(id, ("copy", ref, spill file, row))`` (:func:`partition_pairs`), and on the
    ``pair_counts`` output the oversized buckets' counts (also Beam counters), when there are any."""
    partition, paths = element
    counts: dict[str, int] = {}
    pairs, copies = partition_pairs(((path, read_bands(path, partition)) for path in sorted(set(paths))),
                                    max_bucket_size, counts)
    for id_a, id_b in pairs:
        yield id_a, (PARTNER, id_b)
    for doc_id, copy in sorted(copies.items()):
        yield doc_id, (COPY, *copy)
    if counts:
        for name, n in sorted(counts.items()):
            beam.metrics.Metrics.counter("tidal.clean", name).inc(n)
        yield beam.pvalue.TaggedOutput(PAIR_COUNTS, counts)


def _locate(grouped):
    """``(id, [("partner", id_b) | ("copy", ref, spill file, row)...])`` -> ``(spill file, (id, row, ref,
    partners))``: the candidate's lowest-ref copy (exact copies share the text, so it is read and sent once)
    and its distinct partners of higher id (a pair two partitions found comes twice)."""
    doc_id, values = grouped
    partners, copies = set(), set()
    for value in values:
        if value[0] == PARTNER:
            partners.add(value[1])
        else:
            copies.add(value[1:])
    ref, path, row = min(copies, key=lambda c: (ref_sort_key(c[0]), c))
    return path, (doc_id, row, ref, tuple(sorted(partners)))


def _read_candidates(element):
    """``(spill file, [(id, row, ref, partners)...])`` -> the texts read from the spill file, keyed for
    the verification: ``(id, ("text", ref, text))``, and ``(id_b, ("pair", id, ref, text))`` for
    each partner ``id_b`` of ``id``."""
    path, wanted = element
    wanted = sorted(wanted, key=lambda w: w[1])
    texts = read_texts(path, [w[1] for w in wanted]).to_pylist()
    for (doc_id, _, ref, partners), text in zip(wanted, texts, strict=True):
        yield doc_id, (TEXT, ref, text)
        for id_b in partners:
            yield id_b, (PAIR, doc_id, ref, text)


def _lowest(copies) -> tuple[str, str]:
    """The ``(ref, text)`` of an id's copies with the lowest ref (the exact-dedup survivor)."""
    return min(copies, key=lambda c: (ref_sort_key(c[0]), c[0]))


class _VerifyFn(beam.DoFn):
    """``(id_b, [("text", ref, text) | ("pair", id_a, ref_a, text_a)...])`` -> verified edges
    ``(id_a, ref_a, id_b, ref_b, jaccard)`` (to :class:`tidal.data.neardup_clusters.Clusters`);
    pair counts on the ``pair_counts`` output. Each id comes once, as its copy with the lowest
    ref (the exact-dedup survivor, :func:`_lowest_copy`)."""

    def __init__(self, cfg: NearDupConfig):
        self.cfg = cfg

    def process(self, element):
        id_b, values = element
        copies: list[tuple[str, str]] = []
        firsts: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for value in values:
            if value[0] == TEXT:
                copies.append(value[1:])
            else:
                firsts[value[1]].append(value[2:])
        if not copies or not firsts:
            return
        ref_b, text_b = _lowest(copies)
        shingles_b = shingles(text_b, self.cfg.shingle_size)
        verified = 0
        for id_a in sorted(firsts):
            ref_a, text_a = _lowest(firsts[id_a])
            sim = jaccard(shingles(text_a, self.cfg.shingle_size), shingles_b)
            if sim >= self.cfg.jaccard_threshold:
                verified += 1
                yield id_a, ref_a, id_b, ref_b, round(sim, 6)
        beam.metrics.Metrics.counter("tidal.clean", "neardup.candidate_pairs").inc(len(firsts))
        counts = {"neardup.candidate_pairs": len(firsts)}
        if verified:
            beam.metrics.Metrics.counter("tidal.clean", "neardup.verified_pairs").inc(verified)
            counts["neardup.verified_pairs"] = verified
        yield beam.pvalue.TaggedOutput(PAIR_COUNTS, counts)


class NearDuplicates(beam.PTransform):
    """LSH bucket entries -> ``(removed, pair_counts)``.

    Input: ``(partition, bands file)`` per batch and partition (the file holds :func:`band_entries`'
    arrays, :func:`tidal.data.spill.write_bands`, which say where each document waits in the batch's
    spill files, :mod:`tidal.data.spill`); exact duplicates collapse onto their id with the lowest ref.
    Output: ``removed``, ``(removed id, (survivor id, jaccard))`` (module
    docstring), and ``pair_counts``, dicts ``{"neardup.candidate_pairs": n[,
    "neardup.verified_pairs": m]}`` (also Beam counters of namespace ``tidal.clean``).

    Stages: bucket partitions -> candidate pairs and the candidates' lowest-ref copies; grouped by id,
    each candidate with its partners of higher id and where its text is; grouped by spill file, the
    candidates' texts read (only those rows' text column), each sent to its own id and to each
    partner's; grouped by id, each pair is verified once, where its higher id meets the lower id's
    text; the verified edges -> their connected components -> the star rule on each
    (:class:`tidal.data.neardup_clusters.Clusters`).
    """

    def __init__(self, cfg: NearDupConfig):
        super().__init__()
        self.cfg = cfg

    def expand(self, bands):
        cfg = self.cfg
        partitions = (
            bands
            | "GroupPartitions" >> beam.GroupByKey()
            | "PartitionPairs" >> beam.FlatMap(_partition_candidates, cfg.max_bucket_size).with_outputs(
                PAIR_COUNTS, main="candidates")
        )
        # only candidate documents' texts are read back from the spill files, where the bands say they are
        verified = (
            partitions.candidates
            | "GroupCandidates" >> beam.GroupByKey()
            | "Locate" >> beam.Map(_locate)
            | "BySpillFile" >> beam.GroupByKey()
            | "ReadCandidates" >> beam.FlatMap(_read_candidates)
            | "GroupPairs" >> beam.GroupByKey()
            | "Verify" >> beam.ParDo(_VerifyFn(cfg)).with_outputs(PAIR_COUNTS, main="edges")
        )
        rounds = 0 if one_worker(bands.pipeline.options) else CLUSTER_ROUNDS
        removed = verified.edges | "Clusters" >> Clusters(rounds)
        counts = (verified[PAIR_COUNTS], partitions[PAIR_COUNTS]) | "PairCounts" >> beam.Flatten()
        return removed, counts
