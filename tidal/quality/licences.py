"""Licences of source texts, the uses each permits, and the gate that checks a recipe against them.

Invariant: a recipe whose sources do not all permit every use the recipe declares
(``intended_use``) is refused when it is loaded, before anything is planned or computed, so
``tidal plan``, ``tidal run`` and the Airflow DAG file all stop on it, naming the source's field
(``sources.<name>.licence``), its licence, the use and the rule. A source's ``licence`` is an SPDX
licence expression (:mod:`tidal.quality.spdx`); every licence id in it must be in the table below
(:data:`tidal.quality.licence_table.LICENCES`) or declared in the recipe's ``licences:`` section with
its uses and a reason, which extends or overrides the table for that recipe only. Anything else is
refused, with the one-line declaration that fixes it. Licence fields never enter a step id (they say
whether a run is allowed, not what it computes), so declaring or narrowing them recomputes nothing.

Three uses are distinguished:

* ``research``: training and evaluating models for research, results published as papers.
* ``commercial``: training models used in a commercial product or service.
* ``redistribution_of_weights``: publishing the trained weights.

A source whose rights holder has cleared more uses than its licence's row may widen them with
``licence_override`` (a named reason, recorded in MLflow and in ``tidal lineage``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidal.quality.licence_table import ALL, LICENCES, NO_WEIGHTS, USES, LicenceTerms, Use
from tidal.quality.spdx import LicenceSyntaxError, parse, uses_of

__all__ = ["ALL", "LICENCES", "NO_WEIGHTS", "USES", "LicenceProblem", "LicenceTerms", "Use", "gate_problems",
           "licence_decisions", "licence_tags", "source_decision", "terms"]


@dataclass(frozen=True)
class LicenceProblem:
    """One reason the gate refuses a recipe: the field's path in the recipe (``("sources", name, "licence")``),
    the message, and the value refused."""

    loc: tuple[str, ...]
    message: str
    value: Any


def terms(spdx: str, declared: Mapping[str, Any] | None = None) -> LicenceTerms | None:
    """The row of licence id ``spdx``: the recipe's declaration (``licences:``) if it has one, else the
    built-in table's, else None. ``LicenseRef-`` ids match in any letter case."""
    for table, origin in ((declared or {}, "declared"), (LICENCES, "table")):
        row = table.get(spdx) or next((v for k, v in table.items() if k.lower() == spdx.lower()), None)
        if row is None:
            continue
        if origin == "table":
            return row
        where = f"declared in the recipe's licences: {row.reason}" + (f" ({row.source})" if row.source else "")
        return LicenceTerms(spdx, frozenset(row.uses), where, "declared")
    return None


def _declare_hint(ids: list[str]) -> str:
    first = ids[0]
    return (f"{'licence ' + first if len(ids) == 1 else 'licences ' + ', '.join(ids)} not in tidal's table "
            f"(tidal/quality/licence_table.py) nor declared in the recipe; declare each with its permitted uses and "
            f"a reason: `licences: {{{first}: {{uses: [research], reason: \"where its terms say so\"}}}}`")


def source_decision(name: str, source: Any, declared: Mapping[str, Any]) -> dict[str, Any]:
    """The uses one source permits, and how that was decided.

    Args:
        name: the source's name in the recipe.
        source: a :class:`tidal.recipe.Source` (``licence``, ``permitted_uses``, ``licence_override``).
        declared: the recipe's ``licences:`` section (id -> ``uses``, ``reason``, ``source``); required, so
            that no caller decides without it.

    Returns:
        ``{"licence", "licence_uses", "permitted_uses", "override", "rule", "problems"}``: ``licence`` is
        the normalized expression, ``licence_uses`` what it permits (``A OR B``: union, ``A AND B``:
        intersection), ``problems`` a list of :class:`LicenceProblem`; ``permitted_uses`` is empty and
        ``problems`` non-empty when the source is refused.
    """
    override = source.licence_override.model_dump() if source.licence_override is not None else None
    refused = {"licence": source.licence, "licence_uses": [], "permitted_uses": [], "override": override,
               "rule": "unknown licence"}
    loc = ("sources", name, "licence")
    try:
        expression = parse(source.licence)
    except LicenceSyntaxError as err:
        return refused | {"problems": [LicenceProblem(loc, f"licence gate: {err}", source.licence)]}
    rows = {key: terms(key, declared) for key in expression.ids()}
    uses, unknown = uses_of(expression, lambda key: rows[key].uses if rows[key] is not None else None)
    if unknown:
        return refused | {"licence": expression.text,
                          "problems": [LicenceProblem(loc, f"licence gate: {_declare_hint(unknown)}", source.licence)]}
    allowed = set(uses) | set(override["uses"] if override else ())
    declared_uses = set(source.permitted_uses) if source.permitted_uses is not None else allowed
    rule = "; ".join(f"{row.spdx}: {row.source}" for row in rows.values())
    if len(rows) > 1:
        rule = f"{expression.text} permits {sorted(uses)} (OR: union, AND: intersection); {rule}"
    problems = [
        LicenceProblem(("sources", name, "permitted_uses"),
                       f"licence gate: lists {use!r}, which licence {expression.text} does not permit (rule: {rule}); "
                       "narrow it, or widen it with licence_override and a reason", source.permitted_uses)
        for use in sorted(declared_uses - allowed)
    ]
    widened = sorted(set(override["uses"]) - uses) if override else []
    if widened:
        rule += f"; widened to {widened} by override: {override['reason']}"
    return {"licence": expression.text, "licence_uses": sorted(uses), "permitted_uses": sorted(declared_uses & allowed),
            "override": override, "rule": rule, "problems": problems}


def licence_decisions(sources: Mapping[str, Any], declared: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """:func:`source_decision` of every source, by name (sorted), with the recipe's ``licences:``."""
    return {name: source_decision(name, sources[name], declared) for name in sorted(sources)}


def gate_problems(sources: Mapping[str, Any], intended_use: Iterable[str],
                  declared: Mapping[str, Any]) -> list[LicenceProblem]:
    """Every reason the sources do not allow ``intended_use``, one :class:`LicenceProblem` each; empty
    when the recipe may run.

    Every source is checked, held-out evaluation sources included (they are read by the run).
    """
    problems: list[LicenceProblem] = []
    for name, decision in licence_decisions(sources, declared).items():
        problems += decision["problems"]
        if decision["rule"] == "unknown licence":
            continue
        for use in intended_use:
            if use in decision["permitted_uses"]:
                continue
            if use in decision["licence_uses"]:
                problems.append(LicenceProblem(
                    ("sources", name, "permitted_uses"),
                    f"licence gate: does not permit intended use {use!r} (the source narrows its permitted_uses "
                    f"to {decision['permitted_uses']})", sources[name].permitted_uses))
            else:
                problems.append(LicenceProblem(
                    ("sources", name, "licence"),
                    f"licence gate: {decision['licence']} does not permit intended use {use!r} "
                    f"(rule: {decision['rule']})", sources[name].licence))
    return problems


def licence_tags(sources: Mapping[str, Any], intended_use: Iterable[str],
                 declared: Mapping[str, Any]) -> dict[str, str]:
    """MLflow tags of the parent run: ``tidal.intended_use`` and, per source,
    ``tidal.licence.<src>`` (its SPDX expression), ``tidal.permitted_uses.<src>``, if any,
    ``tidal.licence_override.<src>`` (the override's uses and reason as JSON) and, when the recipe
    declared one of its licences, ``tidal.licence_declared.<src>`` (id -> uses and reason, JSON)."""
    tags = {"tidal.intended_use": ",".join(intended_use)}
    for name, decision in licence_decisions(sources, declared).items():
        tags[f"tidal.licence.{name}"] = decision["licence"]
        tags[f"tidal.permitted_uses.{name}"] = ",".join(decision["permitted_uses"])
        if decision["override"]:
            tags[f"tidal.licence_override.{name}"] = json.dumps(decision["override"], sort_keys=True)
        used = _declared_used(decision["licence"], declared)
        if used:
            tags[f"tidal.licence_declared.{name}"] = json.dumps(used, sort_keys=True)
    return tags


def _declared_used(licence: str, declared: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe's declarations that ``licence`` (an expression) uses: id -> ``{uses, reason, source}``."""
    try:
        ids = {key.lower() for key in parse(licence).ids()}
    except LicenceSyntaxError:
        return {}
    return {key: {"uses": sorted(row.uses), "reason": row.reason, "source": row.source}
            for key, row in declared.items() if key.lower() in ids}
