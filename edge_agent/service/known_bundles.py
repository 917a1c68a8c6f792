"""What the edge vouches for (issue 42): a bundle is known, trusted or unverified
(``shared.trust``); an unverified one is refused with ``--refuse-unverified``, and otherwise
passes the text floor (``shared.floor_text``) before anything is privatized over it.

The trusted ids come from ``--trusted-bundles`` or ``$PRIVBERT_TRUSTED_BUNDLES``; they add
to the bundles privbert knows. ``--refuse-unverified`` (``$PRIVBERT_REFUSE_UNVERIFIED=1``)
refuses every other bundle, as a trusted list alone did before issue 42.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from edge_agent.errors import CliError
from shared.conventions import REFUSE_UNVERIFIED_ENV
from shared.floor_text import text_floor_reason
from shared.mechanisms.dchi import DChiEmbedding, DChiText
from shared.messages import UNVERIFIED_REFUSED
from shared.trust import Trust, trust

if TYPE_CHECKING:
    import numpy as np

    from shared.bundle import EdgeBundle

TRUST_FLAG = "--trusted-bundles"
REFUSE_FLAG = "--refuse-unverified"


class UnverifiedBundle(CliError):
    """An unverified bundle, and the device refuses unverified bundles."""


def refuse_unverified_from_env() -> bool:
    """``$PRIVBERT_REFUSE_UNVERIFIED``: 1, true or yes refuses unverified bundles."""
    return os.environ.get(REFUSE_UNVERIFIED_ENV, "").strip().lower() in ("1", "true", "yes")


def check_vouched(bundle_id: str, trusted: frozenset[str], refuse_unverified: bool) -> Trust:
    """The bundle's trust; :class:`UnverifiedBundle` (one line) for an unverified one when
    the device refuses them (checked before a byte of the bundle is fetched)."""
    t = trust(bundle_id, trusted)
    if refuse_unverified and not t.vouched:
        raise UnverifiedBundle(UNVERIFIED_REFUSED.format(
            bundle_id12=bundle_id[:12], flag=REFUSE_FLAG, trust=TRUST_FLAG, bundle_id=bundle_id))
    return t


def text_floor(bundle: EdgeBundle, mechanism: Any, trusted: frozenset[str], *,
               rng: np.random.Generator | None = None) -> tuple[Trust, str | None]:
    """(the bundle's trust, why dχ on it is weaker than the text floor or None). Known and
    trusted bundles, and the mechanisms without a token table, are not measured; under a
    token policy the words outside its public list are (``shared.floor_text``)."""

    t = trust(bundle.bundle_id, trusted)
    if t.vouched or not isinstance(mechanism, DChiText | DChiEmbedding):
        return t, None
    # dchi-embedding: measured as dchi-text at its η, under its token policy
    text = mechanism if isinstance(mechanism, DChiText) else \
        DChiText(bundle, mechanism.eta, public_p=mechanism.public_p)
    return t, text_floor_reason(text, rng, trust=TRUST_FLAG)
