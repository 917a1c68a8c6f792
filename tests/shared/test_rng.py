"""Every mechanism called without ``rng`` draws from a generator seeded by the operating
system, a new one per call: no module-level generator, no fixed seed anywhere."""

from __future__ import annotations

import numpy as np
import pytest

import shared.rng
from shared.mechanisms import OME, OUE, SUE, DChiEmbedding, DChiText, Laplace, TextHide


@pytest.fixture
def seeding(monkeypatch):
    """Record the SeedSequence entropy of every generator resolve_rng creates."""
    made = []
    real = np.random.default_rng

    def spy(*args, **kwargs):
        g = real(*args, **kwargs)
        made.append((args, kwargs, g.bit_generator.seed_seq.entropy))
        return g

    monkeypatch.setattr(shared.rng.np.random, "default_rng", spy)
    return made


CALLS = {  # name: (build the mechanism, privatize with it and no rng)
    "dchi-embedding": (lambda b: DChiEmbedding(5.0), lambda m, b: m.privatize(b.embeddings[:3])),
    "dchi-text": (lambda b: DChiText(b, 5.0), lambda m, b: m.privatize_ids(np.array([5, 6]))),
    "laplace": (lambda b: Laplace(1.0), lambda m, b: m.privatize(np.arange(4.0))),
    "ome": (lambda b: OME(1.0, 2.0, 4), lambda m, b: m.privatize(np.arange(4.0))),
    "sue": (lambda b: SUE(1.0, 4), lambda m, b: m.privatize(np.arange(4.0))),
    "oue": (lambda b: OUE(1.0, 4), lambda m, b: m.privatize(np.arange(4.0))),
    "texthide": (lambda b: TextHide(4, 2, 4, seed=2**100 + 1),  # the mask pool's secret key
                 lambda m, b: m.encrypt(np.ones((3, 4)), np.eye(2)[[0, 1, 0]])),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_no_rng_means_fresh_os_entropy_per_call(name, tiny_bundle, seeding):
    build, call = CALLS[name]
    mech = build(tiny_bundle)
    seeding.clear()
    call(mech, tiny_bundle)
    call(mech, tiny_bundle)
    # one unseeded generator per call, each with its own 128-bit OS entropy, never a seed
    assert [(args, kw) for args, kw, _ in seeding] == [((), {}), ((), {})]
    first, second = (e for _, _, e in seeding)
    assert first != second and first.bit_length() > 64 and second.bit_length() > 64


def test_a_passed_generator_is_used_as_is(tiny_bundle, seeding):
    g = np.random.Generator(np.random.PCG64(3))
    state = g.bit_generator.state
    DChiEmbedding(5.0).privatize(tiny_bundle.embeddings[:3], g)
    assert seeding == []  # no generator of ours
    assert g.bit_generator.state != state  # the caller's generator advanced
