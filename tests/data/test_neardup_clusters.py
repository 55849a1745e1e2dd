"""Near-duplicate clusters per connected component (tidal/data/neardup_clusters.py): the same removed
documents as one star pass over every edge, on the real Beam runner, and a clear failure when a chain is
longer than the rounds follow."""

from __future__ import annotations

import collections
import itertools
import random

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from tidal.data.neardup_clusters import CLUSTER_ROUNDS, Clusters, hash_to_min, star_clusters


def _id(rng: random.Random) -> str:
    return f"{rng.getrandbits(256):064x}"


def _edge(a: tuple[str, str], b: tuple[str, str], sim: float):
    (id_a, ref_a), (id_b, ref_b) = sorted([a, b])
    return id_a, ref_a, id_b, ref_b, sim


def random_graph(seed: int) -> list:
    """Components of every shape the verification produces: chains, stars, cliques and random graphs,
    documents with refs from several sources, so survivor order is not id order."""
    rng = random.Random(seed)
    edges = []
    for _ in range(40):
        n = rng.randint(2, 30)
        docs = [(_id(rng), f"{rng.choice('abc')}-src.jsonl#{rng.randint(0, 999)}") for _ in range(n)]
        shape = rng.choice(["chain", "star", "clique", "random"])
        if shape == "chain":
            pairs = list(itertools.pairwise(docs))
        elif shape == "star":
            pairs = [(docs[0], d) for d in docs[1:]]
        elif shape == "clique":
            pairs = [(a, b) for i, a in enumerate(docs) for b in docs[i + 1:]]
        else:
            pairs = [(d, rng.choice(docs[:i])) for i, d in enumerate(docs) if i]
            pairs += [tuple(rng.sample(docs, 2)) for _ in range(n)]
        edges += [_edge(a, b, round(rng.uniform(0.75, 1.0), 6)) for a, b in pairs]
    return sorted(set(edges))


def _run(edges, rounds=CLUSTER_ROUNDS, expected=None):
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner", "--direct_num_workers=1"])) as p:
        removed = p | beam.Create(edges, reshuffle=False) | Clusters(rounds)
        if expected is not None:
            assert_that(removed, equal_to(expected))


@pytest.mark.parametrize("seed", [0, 1])
def test_per_component_clusters_remove_what_one_star_pass_over_every_edge_removes(seed):
    edges = random_graph(seed)
    expected = sorted(star_clusters(edges).items())
    assert len(expected) > 300  # the graph has real clusters to get wrong
    _run(edges, expected=expected)
    _run(edges, rounds=0, expected=expected)  # one group: what a one-worker runner uses


def test_a_chain_too_long_for_the_rounds_fails_with_what_happened():
    rng = random.Random(3)
    docs = [(_id(rng), f"s.jsonl#{i}") for i in range(64)]
    edges = [_edge(a, b, 0.9) for a, b in itertools.pairwise(docs)]
    with pytest.raises(Exception, match="near duplicates but 2 rounds of Hash-to-Min left them in two clusters"):
        _run(edges, rounds=2)
    _run(edges, expected=sorted(star_clusters(edges).items()))  # the default rounds follow it


def rounds_to_converge(edges: list[tuple[str, str]], limit: int = 40) -> int:
    """Hash-to-Min rounds (:func:`hash_to_min`, simulated in memory) until both ends of every edge share
    a label: the check :class:`Clusters` applies."""
    neighbours = collections.defaultdict(set)
    for a, b in edges:
        neighbours[a].add(b)
        neighbours[b].add(a)
    sets = {v: tuple(sorted({v, *n})) for v, n in neighbours.items()}
    for n in range(limit):
        if all(sets[a][0] == sets[b][0] for a, b in edges):
            return n
        received = collections.defaultdict(set)
        for element in sets.items():
            for key, values in hash_to_min(element):
                received[key].update(values)
        sets = {v: tuple(sorted(s)) for v, s in received.items()}
    raise AssertionError(f"no convergence in {limit} rounds")


def test_the_default_rounds_follow_a_chain_of_a_thousand_documents_in_any_id_order():
    rng = random.Random(7)
    worst = 0
    for _ in range(3):
        ids = [_id(rng) for _ in range(1000)]
        worst = max(worst, rounds_to_converge(list(itertools.pairwise(ids))))
        ordered = sorted(ids)
        worst = max(worst, rounds_to_converge(list(itertools.pairwise(ordered))))
    assert worst <= CLUSTER_ROUNDS, worst
