"""SPDX licence expressions (``MIT OR Apache-2.0``, ``GPL-2.0-or-later WITH Classpath-exception-2.0``,
``LicenseRef-acme-internal``): parsed and checked with the ``license-expression`` library against the
SPDX licence list it ships (read from the installed package, so it works offline), and the uses an
expression permits computed from the uses of its licences.

Only ids on the SPDX list (their deprecated spellings and any letter case are normalized, e.g.
``GPL-2.0+`` -> ``GPL-2.0-or-later``, ``mit`` -> ``MIT``) and ``LicenseRef-<letters, digits, '.', '-'>``
(SPDX spec, annex D) are licence ids; ScanCode's own ``LicenseRef-scancode-*`` aliases that the library's
index also carries are left out, so a team's ``LicenseRef-`` is never silently read as another licence.

Semantics (SPDX spec annex D.4): ``A OR B`` lets the user choose either licence, so it permits the
union of their uses; ``A AND B`` binds the user to both, so it permits the intersection;
``A WITH E`` permits what ``A`` permits (an exception only adds permissions, so ``A``'s uses are a
lower bound).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

SPDX_LIST_URL = "https://spdx.org/licenses/"
# SPDX spec annex D: idstring = 1*(ALPHA / DIGIT / "-" / ".")
LICENSE_REF = re.compile(r"(?<![A-Za-z0-9.:-])(?:DocumentRef-[A-Za-z0-9.-]+:)?LicenseRef-[A-Za-z0-9.-]+", re.IGNORECASE)


class LicenceSyntaxError(ValueError):
    """Not an SPDX licence expression: the message names the problem (and where, when the parser says)."""


@dataclass(frozen=True)
class Expression:
    """A parsed licence expression: ``text`` is its normalized form, ``tree`` the library's parse tree."""

    text: str
    tree: Any

    def ids(self) -> list[str]:
        """Every licence id in the expression, in order, without repeats (exceptions left out)."""
        out: list[str] = []
        _walk(self.tree, lambda key: out.append(key) if key not in out else None)
        return out


@lru_cache(maxsize=1)
def spdx_list_version() -> str:
    """The version of the SPDX licence list the installed ``license-expression`` ships (e.g. ``3.27``)."""
    from pathlib import Path

    import license_expression

    about = Path(license_expression.__file__).parent / "data" / "license_key_index.json.ABOUT"
    text = about.read_text() if about.exists() else ""
    match = re.search(r"^spdx_license_list_version:\s*(\S+)", text, re.MULTILINE)
    return match.group(1) if match else "unknown"


@lru_cache(maxsize=1)
def _spdx_entries() -> tuple[tuple[str, tuple[str, ...], bool], ...]:
    """``(id, deprecated aliases, is_exception)`` of every entry on the SPDX list, from the library's index."""
    from license_expression import get_license_index

    entries = []
    for entry in get_license_index():
        key = entry.get("spdx_license_key") or ""
        if not key or key.startswith("LicenseRef-"):  # ScanCode's own ids, not on the SPDX list
            continue
        aliases = tuple(a for a in entry.get("other_spdx_license_keys") or () if not a.startswith("LicenseRef-"))
        entries.append((key, aliases, bool(entry.get("is_exception"))))
    return tuple(entries)


@lru_cache(maxsize=256)
def _licensing(refs: tuple[str, ...]) -> Any:
    from license_expression import LicenseSymbol, Licensing

    symbols = [LicenseSymbol(key, aliases=aliases, is_exception=exc) for key, aliases, exc in _spdx_entries()]
    return Licensing(symbols + [LicenseSymbol(ref) for ref in refs])


def parse(text: str) -> Expression:
    """Parse and check one licence expression.

    Raises:
        LicenceSyntaxError: empty, malformed (``MIT OR``, ``(MIT``, ``MIT Apache-2.0``), an id on neither
            the SPDX list nor of the ``LicenseRef-`` form, or an exception used as a licence or the reverse.
    """
    from license_expression import ExpressionError

    if not isinstance(text, str) or not text.strip():
        raise LicenceSyntaxError("empty licence expression: write an SPDX id such as MIT, or an expression "
                                 "such as 'MIT OR Apache-2.0'")
    refs = tuple(sorted(set(LICENSE_REF.findall(text))))
    licensing = _licensing(refs)
    try:
        tree = licensing.parse(text)
        unknown = [key for key in licensing.unknown_license_keys(tree) if key not in refs] if tree is not None else []
        bad_refs = [key for key in unknown if key.lower().startswith(("licenseref-", "documentref-"))]
        if bad_refs:
            raise LicenceSyntaxError(f"{bad_refs[0]!r}: a LicenseRef- id has only letters, digits, '.' and '-' "
                                     "after 'LicenseRef-' (SPDX spec, annex D)")
        if unknown:
            raise LicenceSyntaxError(
                f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not on the SPDX licence "
                f"list {spdx_list_version()} ({SPDX_LIST_URL}); write its SPDX id, or name your own licence "
                "LicenseRef-<name> and declare it under the recipe's `licences:`")
        tree = licensing.parse(text, validate=True, strict=True)
    except ExpressionError as err:
        raise LicenceSyntaxError(f"not a valid SPDX licence expression: {err}") from None
    if tree is None:
        raise LicenceSyntaxError("empty licence expression")
    return Expression(text=str(tree), tree=tree)


def licence_id(text: str) -> str:
    """The normalized form of a single licence id (an SPDX id or ``LicenseRef-``), as a declaration names it.

    Raises:
        LicenceSyntaxError: not an id, or an expression (``A OR B``) or an exception rather than one licence.
    """
    from license_expression import LicenseSymbol

    parsed = parse(text)
    if type(parsed.tree) is not LicenseSymbol or parsed.tree.is_exception:
        raise LicenceSyntaxError(f"{text!r}: declare one licence id (an SPDX id or LicenseRef-<name>), "
                                 "not an expression or an exception")
    return parsed.text


def uses_of(expression: Expression, lookup: Callable[[str], frozenset[str] | None]) -> tuple[frozenset[str], list[str]]:
    """The uses ``expression`` permits, and the ids ``lookup`` does not know.

    Args:
        lookup: a licence id -> its permitted uses, or None when it is unknown.

    Returns:
        ``(uses, unknown ids)``; ``uses`` is only meaningful when no id is unknown.
    """
    unknown: list[str] = []

    def leaf(key: str) -> frozenset[str]:
        found = lookup(key)
        if found is None:
            if key not in unknown:
                unknown.append(key)
            return frozenset()
        return found

    return _evaluate(expression.tree, leaf), unknown


def _evaluate(node: Any, leaf: Callable[[str], frozenset[str]]) -> frozenset[str]:
    from license_expression import AND, OR, LicenseSymbol, LicenseWithExceptionSymbol

    if isinstance(node, LicenseWithExceptionSymbol):
        return leaf(node.license_symbol.key)
    if isinstance(node, LicenseSymbol):
        return leaf(node.key)
    parts = [_evaluate(arg, leaf) for arg in node.args]
    if isinstance(node, OR):
        return frozenset().union(*parts)
    if isinstance(node, AND):
        return frozenset.intersection(*parts)
    raise TypeError(f"unexpected licence expression node {type(node).__name__}")


def _walk(node: Any, visit: Callable[[str], None]) -> None:
    from license_expression import LicenseSymbol, LicenseWithExceptionSymbol

    if isinstance(node, LicenseWithExceptionSymbol):
        visit(node.license_symbol.key)
    elif isinstance(node, LicenseSymbol):
        visit(node.key)
    else:
        for arg in node.args:
            _walk(arg, visit)
