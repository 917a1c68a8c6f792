"""Every parameter of every mechanism, across its whole range: `edge-agent privatize` either
refuses it clearly (exit 2, one line, no warning) or privatizes with parameters that pass the
privacy floor (shared.floor) -- never output close to the raw text without the flag.

Runs `edge_agent.cli.main` in process (the real CLI code; subprocesses are covered in
test_hardening.py) on the tiny bundles, with bounded examples.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edge_agent import Privatizer
from edge_agent.cli import main
from shared.bundle import EdgeBundle
from shared.floor import WeakPrivacyError, check_computable, weak_privacy_reason
from shared.mechanisms import OME, DChiEmbedding, DChiText, Laplace, TextHide
from tests.edge_agent.conftest import TEXTHIDE_KEY

TEXT = "good movie\nthe plot was boring and dull\na very funny story , not bad\n"
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def log_uniform(lo: float = -330.0, hi: float = 308.0):
    """Positive floats spread over every order of magnitude a float64 holds."""
    return st.floats(lo, hi).map(lambda e: min(10.0**e, 1.7976931348623157e308)).filter(
        lambda v: v > 0)


def check(capfd, argv: list[str], build) -> None:
    """Run the CLI; exit 0 iff the mechanism is computable and passes the floor."""
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    out, err = capfd.readouterr()
    assert "Warning" not in err and "Traceback" not in err, err
    try:
        mech, bundle = build()
        check_computable(mech, bundle)
        reason = weak_privacy_reason(mech, bundle)
    except ValueError as exc:  # uncomputable: refused by name
        reason = str(exc)
        assert rc == 2, (argv, err)
    if rc == 2:
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("edge-agent: error: "), err
        assert reason is not None, (argv, err)  # refused only what the floor refuses
        assert any(f"{p}=" in lines[0] for p in ("eta", "epsilon", "lam", "m")), lines[0]
        assert out == ""
        return
    assert rc == 0 and reason is None, (argv, rc, err, reason)
    records = [json.loads(x) for x in out.splitlines()]
    assert len(records) == 3 and "WEAK PRIVACY" not in err


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    p = tmp_path_factory.mktemp("prop") / "in.txt"
    p.write_text(TEXT)
    return str(p)


@pytest.mark.parametrize("mechanism", ["dchi-text", "dchi-embedding"])
@SETTINGS
@given(eta=log_uniform())
@example(eta=1e308)
@example(eta=1.7976931348623157e308)
@example(eta=5e-324)
@example(eta=1e-40)
@example(eta=12.0)
@example(eta=14.0)
@example(eta=1e-3)
def test_dchi_eta_over_its_whole_range(mechanism, eta, capfd, source, tiny_model_dir,
                                       tiny_bundle):
    def build():
        mech = DChiText(tiny_bundle, eta) if mechanism == "dchi-text" else DChiEmbedding(eta)
        return mech, tiny_bundle

    check(capfd, ["privatize", source, "--mechanism", mechanism, "--eta", repr(eta),
                  "--bundle", str(tiny_model_dir)], build)


@SETTINGS
@given(eps=log_uniform(), calibration=st.sampled_from(["vector", "coordinate"]))
@example(eps=1e300, calibration="vector")
@example(eps=1e-40, calibration="coordinate")
@example(eps=1e9, calibration="coordinate")
@example(eps=1.0, calibration="vector")
def test_laplace_epsilon_over_its_whole_range(eps, calibration, capfd, source, tiny_enc_dir,
                                              tiny_enc_bundle):
    check(capfd, ["privatize", source, "--mechanism", "laplace", "--epsilon", repr(eps),
                  "--calibration", calibration, "--bundle", str(tiny_enc_dir)],
          lambda: (Laplace(eps, calibration), tiny_enc_bundle))


@SETTINGS
@given(eps=log_uniform(), lam=log_uniform())
@example(eps=1.0, lam=100.0)
@example(eps=1.0, lam=1e20)
@example(eps=1e300, lam=1.0)
@example(eps=1.0, lam=1e-300)
@example(eps=1.0, lam=1e6)
def test_ome_epsilon_and_lambda_over_their_whole_range(eps, lam, capfd, source, tiny_enc_dir,
                                                        tiny_enc_bundle):
    dim = tiny_enc_bundle.meta["encoder"]["output_dim"]
    check(capfd, ["privatize", source, "--mechanism", "ome", "--epsilon", repr(eps), "--lam",
                  repr(lam), "--bundle", str(tiny_enc_dir)],
          lambda: (OME(eps, lam, dim), tiny_enc_bundle))


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(0, 16).map(lambda e: 2**e))
@example(m=10**8)
@example(m=10**12)
@example(m=2**40)
def test_texthide_m_over_its_whole_range(m, capfd, source, tiny_enc_dir, tiny_enc_bundle):
    """Pools up to 2^16 masks are drawn; beyond the 1 GiB pool limit m is refused by name
    (--m 100000000 used to end in a MemoryError)."""
    dim = tiny_enc_bundle.meta["encoder"]["output_dim"]
    check(capfd, ["privatize", source, "--mechanism", "texthide", "--m", str(m),
                  "--texthide-key", TEXTHIDE_KEY, "--bundle", str(tiny_enc_dir)],
          lambda: (TextHide(m if m * dim > 2**30 else 1, 1, dim, seed=0), tiny_enc_bundle))


# -- the Privatizer (Python API) -------------------------------------------------------------
def test_privatizer_refuses_weak_parameters_unless_allowed(tiny_bundle):
    with pytest.raises(WeakPrivacyError, match="privacy floor"):
        Privatizer(tiny_bundle, DChiText(tiny_bundle, 1000.0))
    p = Privatizer(tiny_bundle, DChiText(tiny_bundle, 1000.0), allow_weak_privacy=True)
    assert "came back unchanged" in p.weak_privacy
    out = p.privatize(["good movie"], rng=np.random.default_rng(0))
    assert out[0].data_array().tolist() == tiny_bundle.tokenizer.encode(
        "good movie", add_special_tokens=False).ids  # what "close to the raw text" means
    assert Privatizer(tiny_bundle, DChiText(tiny_bundle, 2.0)).weak_privacy is None
    assert Privatizer(tiny_bundle, "none").weak_privacy is None  # named explicitly
    with pytest.raises(ValueError, match="float16 payload"):
        Privatizer(tiny_bundle, DChiEmbedding(1e-3), float_dtype="float16",
                   allow_weak_privacy=True)


def test_report_shows_where_the_floor_starts(capfd, tiny_model_dir, tmp_path):
    from shared.floor import dchi_floor_eta

    bundle = EdgeBundle.from_model(tiny_model_dir)
    floor_eta = dchi_floor_eta(bundle)
    assert math.isfinite(floor_eta)
    rc = main(["report", "--eta", "3", "--tokens", "10", "--samples", "20",
               "--inversion-tokens", "200", "--bundle", str(tiny_model_dir), "--json"])
    out, _ = capfd.readouterr()
    rep = json.loads(out)
    # both estimates draw their (token, direction) pairs afresh: 1,000 pairs each
    assert rc == 0 and rep["privacy_floor"]["eta"] == pytest.approx(floor_eta, rel=0.15)
    assert rep["privacy_floor"]["unchanged"] < 0.97
    rc = main(["report", "--eta", "3", "--tokens", "10", "--samples", "20",
               "--inversion-tokens", "200", "--bundle", str(tiny_model_dir)])
    out, _ = capfd.readouterr()
    m = re.search(r"privacy floor \(shared.floor\): from eta=([0-9.]+) on more than 97% of "
                  r"tokens come back unchanged", out)
    assert m and float(m.group(1)) == pytest.approx(floor_eta, rel=0.15)
