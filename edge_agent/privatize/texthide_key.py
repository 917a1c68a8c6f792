"""The client's secret TextHide key: the seed of the mask pool, at least 128 bits.

TextHide's masks come from ``numpy.random.default_rng(seed)``; anyone who can guess
the seed can rebuild the pool and, at k = 1, take the mask off. A small integer is
found by trying seeds, so the key is a hex string of at least 32 hex digits (128
bits), e.g. from ``secrets.token_hex(16)``, given with ``--texthide-key`` or
``$PRIVBERT_TEXTHIDE_KEY``. ``--texthide-seed`` / ``$PRIVBERT_TEXTHIDE_SEED`` are
deprecated aliases with the same check. Error messages never repeat the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

KEY_ENV = "PRIVBERT_TEXTHIDE_KEY"
SEED_ENV = "PRIVBERT_TEXTHIDE_SEED"  # deprecated alias of KEY_ENV
MIN_HEX_DIGITS = 32  # 128 bits
MAKE_ONE = 'python -c "import secrets; print(secrets.token_hex(16))"'
_HEX = re.compile(r"^(?:0[xX])?([0-9a-fA-F]+)$")


def key_to_seed(key: str, source: str = "--texthide-key") -> int:
    """The integer seed of ``shared.mechanisms.TextHide`` for a hex key.

    ValueError (naming ``source``, not the key) for anything but at least 32 hex
    digits, or for a small number padded with zeros (fewer than 24 significant digits).
    """
    m = _HEX.match(key.strip())
    digits = m.group(1) if m else ""
    if len(digits) < MIN_HEX_DIGITS or len(digits.lstrip("0")) < MIN_HEX_DIGITS - 8:
        raise ValueError(f"{source} must be a secret key of at least {MIN_HEX_DIGITS} random "
                         f"hex digits (128 bits; a small seed is found by trying seeds); make "
                         f"one with: {MAKE_ONE}")
    return int(digits, 16)


def resolve_key(key: str | None, seed: str | None,
                environ: Mapping[str, str] | None = None) -> tuple[int | None, str | None]:
    """(mask-pool seed or None for a fresh pool, a deprecation warning or None).

    Order: ``--texthide-key``, ``--texthide-seed``, ``$PRIVBERT_TEXTHIDE_KEY``,
    ``$PRIVBERT_TEXTHIDE_SEED`` (an empty variable counts as unset).
    """
    env = os.environ if environ is None else environ
    if key is not None and seed is not None:
        raise ValueError("give --texthide-key or its deprecated alias --texthide-seed, not both")
    sources = [(key, "--texthide-key", False), (seed, "--texthide-seed", True),
               (env.get(KEY_ENV) or None, f"${KEY_ENV}", False),
               (env.get(SEED_ENV) or None, f"${SEED_ENV}", True)]
    for value, source, deprecated in sources:
        if value is None:
            continue
        note = (f"{source} is deprecated: use --texthide-key (or ${KEY_ENV})"
                if deprecated else None)
        return key_to_seed(value, source), note
    return None, None
