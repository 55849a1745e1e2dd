"""Near-duplicate clusters without a single worker in the middle: connected components, then the star rule
per component.

The star rule (:func:`star_clusters`) walks documents in survivor order and lets each
unassigned one take its unassigned verified neighbours. Which documents a centre takes depends only on
documents of its own connected component (an edge never leaves a component), so running the rule on each
component apart gives exactly what one run over every edge gives: the same survivors, the same removed
rows, the same bytes. What has to be distributed is finding the components:

1. ``Neighbours``: the verified edges grouped by document: ``C_v = {v} | N(v)`` (a group is one
   document's degree).
2. ``rounds`` rounds of Hash-to-Min (Rastogi, Machanavajjhala, Chitnis & Das Sarma, "Finding Connected
   Components in Map-Reduce in Logarithmic Rounds", ICDE 2013): each ``v`` sends its set ``C_v`` to
   ``m = min(C_v)`` and ``{m}`` to every member of ``C_v``; a document's new set is the union of what it
   received. It reaches its fixed point (the component's smallest id holds the component, every other
   member holds that id) in a number of rounds logarithmic in the component's diameter. Measured with
   tests/data/test_neardup_clusters.py's simulation: a chain of 100 documents in random id order needs 9
   rounds, of 1,000 needs 12 (:data:`CLUSTER_ROUNDS`), of 5,000 needs 15; a chain of versioned copies
   in a web corpus is far shorter.
3. ``label(v) = min(C_v)``. Every edge is checked to join two documents of the same label: if a chain
   was too long for the rounds, the step fails with that message rather than cluster a component in two
   parts (which would keep a document the one-worker rule removes).
4. The edges grouped by label, the star rule run on each group.

The largest group any worker receives is therefore the largest component's edges (step 4) or ids (step
2), never the corpus's: near-duplicate components are small except for templated pages, whose size the
LSH bucket cap already bounds in pairs (:func:`tidal.data.neardup.bucket_pairs`).

On a runner with one worker in this process (:func:`tidal.data.beam_options.one_worker`, the default for a
step run in-process) there is no middle to avoid, and each of the rounds' stages would only add the
runner's fixed cost per stage (0.45 s a clean step, measured): there ``rounds=0`` puts every edge in one
group, which gives the same removed documents (the star rule per component is the star rule).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import apache_beam as beam

from tidal.data.sources import ref_sort_key

CLUSTER_ROUNDS = 12
Edge = tuple[str, str, str, str, float]  # (id_a, ref_a, id_b, ref_b, jaccard), id_a < id_b


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


class ClusterDidNotConverge(RuntimeError):
    """A component of near duplicates needed more Hash-to-Min rounds than the transform has."""


def _ends(edge: Edge) -> Iterable[tuple[str, str]]:
    yield edge[0], edge[2]
    yield edge[2], edge[0]


def _first_set(grouped: tuple[str, Iterable[str]]) -> tuple[str, tuple[str, ...]]:
    """``(v, neighbours)`` -> ``(v, sorted {v} | neighbours)``."""
    v, neighbours = grouped
    return v, tuple(sorted({v, *neighbours}))


def hash_to_min(element: tuple[str, tuple[str, ...]]) -> Iterable[tuple[str, tuple[str, ...]]]:
    """One Hash-to-Min send: ``(v, C_v)`` -> ``(min C_v, C_v)`` and ``(u, (min C_v,))`` for each ``u`` in
    ``C_v`` (module docstring, step 2)."""
    _, members = element
    smallest = members[0]
    yield smallest, members
    for u in members:
        yield u, (smallest,)


def _union(grouped: tuple[str, Iterable[tuple[str, ...]]]) -> tuple[str, tuple[str, ...]]:
    v, sets = grouped
    return v, tuple(sorted(set().union(*sets)))


def _label(element: tuple[str, tuple[str, ...]]) -> tuple[str, str]:
    return element[0], element[1][0]


def _by_lower_end(edge: Edge) -> tuple[str, Edge]:
    return edge[0], edge


def _to_higher_end(grouped) -> Iterable[tuple[str, tuple[str, Edge]]]:
    """``(id_a, {"label": [m], "edges": [...]})`` -> ``(id_b, (m, edge))`` for each edge of ``id_a``."""
    _, joined = grouped
    (label,) = joined["label"]
    for edge in joined["edges"]:
        yield edge[2], (label, edge)


def _checked(grouped, rounds: int) -> Iterable[tuple[str, Edge]]:
    """``(id_b, {"label": [m], "edges": [(m_a, edge)...]})`` -> ``(m, edge)``; raises
    :class:`ClusterDidNotConverge` where the two ends of an edge got different labels."""
    id_b, joined = grouped
    (label,) = joined["label"]
    for label_a, edge in joined["edges"]:
        if label_a != label:
            raise ClusterDidNotConverge(
                f"near-duplicate clustering: documents {edge[0]} and {id_b} are verified near duplicates but "
                f"{rounds} rounds of Hash-to-Min left them in two clusters ({label_a} and {label}): "
                "a chain of near duplicates longer than the transform follows (tidal/data/neardup_clusters.py)")
        yield label, edge


def _one_group(edge: Edge) -> tuple[str, Edge]:
    return "", edge


def _star_items(grouped: tuple[str, Iterable[Edge]]) -> list[tuple[str, tuple[str, float]]]:
    """``(label, component's edges)`` -> the star rule's ``(removed, (survivor, jaccard))``, in id order."""
    return sorted(star_clusters(grouped[1]).items())


class Clusters(beam.PTransform):
    """Verified edges ``(id_a, ref_a, id_b, ref_b, jaccard)`` -> ``(removed id, (survivor id, jaccard))``,
    exactly :func:`star_clusters` of all the edges, computed per connected component
    (module docstring). Raises :class:`ClusterDidNotConverge` (in the job) when ``rounds`` were too few;
    ``rounds=0``: every edge in one group, for a runner with one worker."""

    def __init__(self, rounds: int = CLUSTER_ROUNDS):
        super().__init__()
        self.rounds = rounds

    def expand(self, edges):
        if self.rounds == 0:  # one worker: one group (module docstring)
            return (edges
                    | "OneGroup" >> beam.Map(_one_group)
                    | "Components" >> beam.GroupByKey()
                    | "StarClusters" >> beam.FlatMap(_star_items))
        sets = (edges
                | "Ends" >> beam.FlatMap(_ends)
                | "Neighbours" >> beam.GroupByKey()
                | "FirstSets" >> beam.Map(_first_set))
        for n in range(self.rounds):
            sets = (sets
                    | f"Send{n}" >> beam.FlatMap(hash_to_min)
                    | f"Receive{n}" >> beam.GroupByKey()
                    | f"Union{n}" >> beam.Map(_union))
        labels = sets | "Labels" >> beam.Map(_label)
        at_higher_end = (
            {"label": labels, "edges": edges | "ByLowerEnd" >> beam.Map(_by_lower_end)}
            | "JoinLowerEnd" >> beam.CoGroupByKey()
            | "ToHigherEnd" >> beam.FlatMap(_to_higher_end))
        return (
            {"label": labels, "edges": at_higher_end}
            | "JoinHigherEnd" >> beam.CoGroupByKey()
            | "Checked" >> beam.FlatMap(_checked, self.rounds)
            | "Components" >> beam.GroupByKey()
            | "StarClusters" >> beam.FlatMap(_star_items))
