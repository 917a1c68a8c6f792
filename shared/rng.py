"""Randomness policy for every mechanism.

A caller that passes a :class:`numpy.random.Generator` gets exactly that
generator (reproducible runs, tests). Without one, each call draws fresh
entropy from the operating system: the noise protects people only if nobody
can predict it, so there is no module-level default generator to seed.
"""

from __future__ import annotations

import numpy as np


def resolve_rng(rng: np.random.Generator | None) -> np.random.Generator:
    """Return ``rng`` itself, or a new generator seeded from OS entropy."""
    if rng is None:
        # default_rng() with no seed asks SeedSequence for OS entropy (os.urandom).
        return np.random.default_rng()
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}; "
            "pass numpy.random.default_rng(seed) for a reproducible run"
        )
    return rng
