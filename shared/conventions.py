"""What both edges call the same things on a device: the ledger's day and clock anchors, the
environment variables and files of the bundle cache and the pins, and how a worst-case ε is
written in a message.

None of this is privacy math, but an edge that reads another name or another window would
keep another ledger or trust other bundles than the one beside it. The mechanism spec
(``shared.spec``) publishes these values; the web edge reads them from its generated module,
the Python edge imports them from here.
"""

from __future__ import annotations

from typing import Any

# -- the device ledger ----------------------------------------------------------------------------
DAY_S = 86_400.0
"""The per-day cap's window: the charges of the last 24 hours (rolling, not a calendar day)."""
MAX_ANCHORS = 16
"""Clock epochs (boots) whose anchors a ledger keeps, the most recent; an older one counts as
unseen, so the ledger's time cannot be moved back by replaying an old boot."""

# -- the bundle cache and the pins ------------------------------------------------------------------
CACHE_ENV = "PRIVBERT_CACHE"
"""Where bundles are cached: ``$PRIVBERT_CACHE/<bundle_id>``, else
``$XDG_CACHE_HOME/privbert/bundles/<bundle_id>`` (``~/.cache`` when unset)."""
CACHE_SUBDIR = ("privbert", "bundles")
PINS_FILE = "pins.json"
"""In the cache root: the bundle each (server, model) was first seen with (trust on first use)."""
TRUSTED_ENV = "PRIVBERT_TRUSTED_BUNDLES"
"""Comma-separated bundle ids the app trusts as they are, beside the bundles privbert knows
(``shared.trust``)."""
REFUSE_UNVERIFIED_ENV = "PRIVBERT_REFUSE_UNVERIFIED"
"""1: refuse every bundle that is neither known nor trusted (``--refuse-unverified``)."""

# -- ε in messages -----------------------------------------------------------------------------------
EPS_SIGNIFICANT = 4
"""Significant digits of an ε under ``EPS_GROUPED_FROM`` or from ``EPS_SCIENTIFIC_FROM``
(``%.4g``: huge ones in scientific notation)."""
EPS_GROUPED_FROM = 100.0
"""From here, an ε is written with thousands commas and ``EPS_GROUPED_DECIMALS`` decimals."""
EPS_GROUPED_DECIMALS = 1
EPS_SCIENTIFIC_FROM = 1e9


def fmt_eps(eps: float | None) -> str:
    """A worst-case ε for a message: "none", ``%.4g`` below 100 and from 1e9, else
    ``1,234.5``."""
    if eps is None:
        return "none"
    if EPS_GROUPED_FROM <= eps < EPS_SCIENTIFIC_FROM:
        return f"{eps:,.{EPS_GROUPED_DECIMALS}f}"
    return f"{eps:.{EPS_SIGNIFICANT}g}"


def spec_section() -> dict[str, Any]:
    """These values as the mechanism spec publishes them."""
    return {"ledger": {"day_s": DAY_S, "max_anchors": MAX_ANCHORS},
            "cache": {"env": CACHE_ENV, "subdir": list(CACHE_SUBDIR), "pins_file": PINS_FILE,
                      "trusted_env": TRUSTED_ENV, "refuse_env": REFUSE_UNVERIFIED_ENV},
            "eps_format": {"significant": EPS_SIGNIFICANT, "grouped_from": EPS_GROUPED_FROM,
                           "grouped_decimals": EPS_GROUPED_DECIMALS, "scientific_from": EPS_SCIENTIFIC_FROM}}
