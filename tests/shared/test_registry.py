"""The mechanism registry: each registered class states what it is and builds itself from its
parameters, and each object reaches its cost, floor and guarantee (the analysis modules
registered them; the mechanism modules import none of them)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from pydantic import BaseModel

from shared import accounting, floor, ledger
from shared.accounting import bundle_diameter
from shared.mechanisms import (
    OME,
    BaseMechanism,
    DChiEmbedding,
    DChiText,
    Laplace,
    Mechanism,
    NoPrivacy,
    PayloadKind,
    TextHide,
    as_mechanism,
    create,
    get,
    register,
    registry,
)
from shared.payload import MECHANISMS, PAYLOAD_CLASSES
from tests.conftest import REPO

DIM = 8


def objects(bundle) -> list[BaseMechanism]:
    return [NoPrivacy(), DChiText(bundle, 20.0), DChiEmbedding(20.0), Laplace(2.0),
            OME(2.0, 1.5, DIM), TextHide(4, 1, DIM, seed=1)]


def test_the_built_in_names_the_wire_and_the_classes_agree():
    assert MECHANISMS == registry.names() == ("none", "dchi-text", "dchi-embedding",
                                              "laplace", "ome", "texthide")
    for name in MECHANISMS:
        cls = get(name)
        assert cls.name == name and isinstance(cls.payload_kind, PayloadKind)
        assert cls.family in ledger.FAMILIES
        # the typed parameters are the wire's params model
        assert PAYLOAD_CLASSES[name].model_fields["params"].annotation is cls.Params
        assert issubclass(cls.Params, BaseModel)


def test_from_params_rebuilds_each_object_and_the_protocol_holds(tiny_bundle):
    for mech in objects(tiny_bundle):
        assert isinstance(mech, Mechanism)
        again = create(mech.name, mech.params, tiny_bundle, dim=DIM, secret=1)
        assert type(again) is type(mech) and again.params == mech.params
        assert get(mech.name).canonical_params(mech.params) == mech.params


def test_cost_floor_and_guarantee_are_reached_through_the_object(tiny_bundle):
    d = bundle_diameter(tiny_bundle)
    for mech in objects(tiny_bundle):
        size = {"tokens": 7, "diameter": d} if mech.payload_kind.reads_tokens else {"dim": DIM}
        assert mech.cost(**size) == ledger.cost(mech.name, mech.params, **size)
        # the same seeded draws through the object and through the module
        assert mech.weak_privacy_reason(tiny_bundle, threshold=floor.THRESHOLD, dim=DIM,
                                        rng=np.random.default_rng(3)) == \
            floor.weak_privacy_reason(mech, tiny_bundle, dim=DIM, rng=np.random.default_rng(3))
        g = mech.guarantee(tiny_bundle, dim=DIM, sample=50)
        assert g == accounting.guarantee(mech, tiny_bundle, dim=DIM, sample=50)
        assert g["mechanism"] == mech.name and g["params"] == mech.params
    assert NoPrivacy().cost().family == "none" and NoPrivacy().cost().epsilon is None
    assert NoPrivacy().guarantee()["worst_case"]["epsilon"] == math.inf
    assert "no privatization" in NoPrivacy().weak_privacy_reason(threshold=0.99)


def test_the_name_none_stands_for_no_privacy():
    assert as_mechanism("none") == NoPrivacy() and as_mechanism(NoPrivacy()) == NoPrivacy()
    assert not get("none").private and not get("none").has_epsilon
    with pytest.raises(registry.MissingParameter, match="dchi-embedding needs eta"):
        as_mechanism("dchi-embedding")
    with pytest.raises(registry.NoEncoder, match="no bundle was given"):
        as_mechanism("laplace")
    with pytest.raises(ValueError, match="unknown mechanism 'dchi'; one of none, dchi-text"):
        get("dchi")


def test_factory_errors_name_what_is_missing(tiny_bundle):
    with pytest.raises(registry.NoEncoder, match="encoder.onnx"):
        create("ome", {"epsilon": 1.0, "lam": 2.0}, tiny_bundle)  # no encoder in the bundle
    with pytest.raises(registry.MissingParameter) as exc:
        create("texthide", {"m": 4}, tiny_bundle, dim=DIM)
    assert (exc.value.mechanism, exc.value.param) == ("texthide", "k")
    with pytest.raises(ValueError, match="eta must be a finite number > 0"):
        create("dchi-embedding", {"eta": -1.0})


def test_register_refuses_a_taken_name_and_an_incomplete_class():
    class Again(Laplace):
        name = "laplace"

    class Nameless(BaseMechanism):
        pass

    with pytest.raises(ValueError, match="the name is taken"):
        register(Again)
    with pytest.raises(ValueError, match="it has no name"):
        register(Nameless)
    assert get("laplace") is Laplace


def test_a_mechanism_without_a_floor_is_an_error_not_a_pass():
    class Bare(BaseMechanism):
        name, Params, payload_kind, family = "bare", BaseModel, PayloadKind.VECTOR, "laplace"

        @property
        def params(self) -> dict:
            return {}

    with pytest.raises(TypeError, match="no privacy floor for Bare"):
        Bare().weak_privacy_reason(threshold=0.99)
    with pytest.raises(TypeError, match="no accounting for Bare"):
        Bare().guarantee()
    Bare().check_computable()  # nothing registered: nothing that can overflow


def test_a_mechanism_module_alone_finds_its_analysis():
    """Importing one mechanism module loads the analysis that registers its functions (the
    ``shared`` package does), in a fresh interpreter."""
    code = ("from shared.mechanisms.laplace import Laplace\n"
            "m = Laplace(2.0, 'coordinate')\n"
            "print(m.cost(dim=3).epsilon, m.guarantee(dim=3)['worst_case']['epsilon'])\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["6.0", "6.0"]  # r x epsilon for the coordinate calibration
