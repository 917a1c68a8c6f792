"""Privacy report (Qu et al. §5.3–5.4) on the tiny bundle: N_w/S_w, inversion, target η."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edge_agent.cli import main
from edge_agent.report import (
    FixedDraw,
    distinct_per_row,
    plausible_deniability,
    target_eta,
)
from shared.mechanisms import DChiText
from tests.edge_agent.conftest import assert_one_line_error, run_cli


def test_distinct_per_row():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, size=(50, 9))
    assert distinct_per_row(x).tolist() == [len(set(r)) for r in x.tolist()]


def test_plausible_deniability_shapes_and_bounds(tiny_bundle):
    mech = DChiText(tiny_bundle, 3.0)
    ids = tiny_bundle.regular_ids[:12]
    k = 150
    n_w, s_w = plausible_deniability(mech, ids, k, np.random.default_rng(0), max_queries=1000)
    assert n_w.shape == s_w.shape == (12,)
    assert (0 <= n_w).all() and (n_w <= k).all()
    assert (1 <= s_w).all() and (s_w <= min(k, tiny_bundle.regular_ids.size)).all()
    # no noise to speak of: every output is the input
    n_w, s_w = plausible_deniability(DChiText(tiny_bundle, 1e6), ids, 20, np.random.default_rng(1))
    assert (n_w == 20).all() and (s_w == 1).all()
    # overwhelming noise: outputs spread over the vocabulary (1/32 chance each to stay);
    # mean N_w/K over 12 x 200 draws is within 0.1 of 1/32
    n_w, s_w = plausible_deniability(DChiText(tiny_bundle, 1e-3), ids, 200,
                                     np.random.default_rng(2))
    assert abs(n_w.mean() / 200 - 1 / 32) < 0.1 and s_w.min() >= 15


def test_inversion_accuracy_is_monotone_in_eta(tiny_bundle):
    draw = FixedDraw(DChiText(tiny_bundle, 1.0), np.tile(tiny_bundle.regular_ids, 40),
                     np.random.default_rng(3))
    accs = [draw.accuracy(e) for e in np.geomspace(0.3, 40, 30)]
    assert all(b >= a for a, b in zip(accs, accs[1:], strict=False))
    assert accs[0] < 0.2 and accs[-1] > 0.95


def test_fixed_draw_matches_the_mechanism(tiny_bundle):
    """Scaling one Gamma(n,1)·u draw by 1/η is the mechanism's noise: the accuracy on the
    fixed draw equals DChiText's unchanged rate on fresh noise within 5 standard errors."""
    ids = np.tile(tiny_bundle.regular_ids, 150)  # 4,800 tokens
    mech = DChiText(tiny_bundle, 2.5)
    fixed = FixedDraw(mech, ids, np.random.default_rng(4)).accuracy(2.5)
    fresh = float((mech.privatize_ids(ids, np.random.default_rng(5)) == ids).mean())
    se = math.sqrt(2 * fixed * (1 - fixed) / ids.size)
    assert abs(fixed - fresh) <= 5 * se


@pytest.mark.parametrize("target", [0.05, 0.3, 0.5, 0.9])
def test_target_eta_within_tolerance(tiny_bundle, target):
    draw = FixedDraw(DChiText(tiny_bundle, 1.0), np.tile(tiny_bundle.regular_ids, 60),
                     np.random.default_rng(6))
    eta, acc = target_eta(draw, target)
    assert abs(acc - target) <= 0.01 and acc == draw.accuracy(eta)
    assert draw.evaluations < 80


def test_report_cli_json(tiny_enc_dir, tmp_path):
    sample = tmp_path / "sample.tsv"
    sample.write_text("sentence\tlabel\nthe movie is good\t1\nbad plot , awful actor\t0\n" * 50)
    proc = run_cli("report", "--target-inversion", "0.4", "--tokens", "20", "--samples", "100",
                   "--sample", str(sample), "--json", "--seed", "0", "--bundle",
                   str(tiny_enc_dir))
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert len(rep["n_w"]) == len(rep["s_w"]) == 20
    assert all(0 <= v <= 100 for v in rep["n_w"]) and all(1 <= v <= 100 for v in rep["s_w"])
    inv = rep["inversion"]
    assert inv["source"] == "sample text" and inv["tokens"] == 450  # 9 word pieces x 50
    assert abs(inv["accuracy"] - 0.4) <= 0.01
    table = [(row["eta"], row["accuracy"]) for row in inv["table"]]
    assert [a for _, a in sorted(table)] == sorted(a for _, a in table)  # monotone
    assert rep["eta"] in [e for e, _ in table]
    assert rep["guarantee"]["mechanism"] == "dchi-text"
    # split by token class: content = not a stop word ("the", "is", ","), rare = outside the
    # sample's 4,096 most frequent tokens (none here: a tiny sample)
    bc = rep["inversion_by_class"]
    assert bc["tokens"] == {"all": 450, "content": 300, "rare": 0}
    assert bc["accuracy"]["rare"] is None and 0 <= bc["accuracy"]["content"] <= 1
    assert bc["accuracy"]["all"] == pytest.approx(inv["accuracy"])
    # the server-side contextual attack: said to exist, with the command that measures it
    how = rep["contextual_attack"]["how"]
    assert rep["contextual_attack"]["measured"] is False
    assert how.startswith("cloud-api evaluate --attack --mechanism dchi-text --eta ")
    assert f"--eta {rep['eta']:.4g} " in how and "--denoiser" in how


def test_report_cli_text_and_plot(tiny_enc_dir, tmp_path, capfd):
    png = tmp_path / "fig.png"
    rc = main(["report", "--eta", "3", "--mechanism", "dchi-embedding", "--tokens", "10",
               "--samples", "50", "--inversion-tokens", "500", "--plot", str(png), "--bundle",
               str(tiny_enc_dir)])
    out = capfd.readouterr().out
    assert rc == 0
    assert "N_w (outputs equal to the input)" in out and "S_w (distinct outputs)" in out
    assert "token embedding inversion" in out and "guarantee: dchi-embedding" in out
    assert "contextual attack" not in out  # the denoiser reads dchi-text only
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_bad_input(tmp_path, tiny_enc_dir):
    for argv, needle in [(["--eta", "0"], "--eta must be"),
                         (["--target-inversion", "1.5"], "--target-inversion must be in"),
                         (["--eta", "3", "--samples", "0"],
                          "argument --samples: expected an integer >= 1"),
                         (["--eta", "3", "--etas", "1,x"], "--etas"),
                         (["--eta", "3", "--sample", str(tmp_path / "nope")], "no such file")]:
        proc = run_cli("report", *argv, "--bundle", str(tiny_enc_dir))
        assert_one_line_error(proc, None, needle)


def test_text_report_names_the_contextual_attack(tiny_enc_dir, capfd):
    """dchi-text: the report says a server with a contextual model recovers more than the
    inversion and how to measure it (server side); the published guarantee is still there."""
    rc = main(["report", "--eta", "3", "--tokens", "5", "--samples", "20",
               "--inversion-tokens", "200", "--bundle", str(tiny_enc_dir)])
    out = capfd.readouterr().out
    assert rc == 0
    assert "guarantee: dchi-text" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("contextual attack:"))
    assert "recovers more tokens at the same eta" in line
    assert line.endswith("cloud-api evaluate --attack --mechanism dchi-text --eta 3 --data "
                         "TEXT.tsv --denoiser MODEL_VERSION_OR_FILE")
