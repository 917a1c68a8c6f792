"""The text floor (shared.floor_text): its decoder, its sample, its stopping rule and its
refusals, on the tiny bundle (the crafted bundles of issue 42 and the genuine tables are in
tests/edge_agent/test_hostile_text.py, through the real edge-agent)."""

from __future__ import annotations

import numpy as np
import pytest

from shared import floor_text as ft
from shared.mechanisms import DChiText


def loo(x, y, prior=None):
    x, y = np.array(x), np.array(y)
    if prior is None:
        prior = {int(a): int((x == a).sum()) for a in set(x.tolist())}
    return ft.leave_one_out(x, y, prior)


def test_the_decoder_is_never_scored_on_the_draw_it_learnt_from():
    """Each output seen once, from another input: resubstitution would decode all four;
    left out, each output is decoded as itself, which is right only for the unchanged one."""
    assert loo([1, 2, 3, 4], [9, 8, 7, 4]) == 1


def test_the_decoder_weighs_the_prior_and_the_channel():
    """Output 5 came from 1 twice (of 3 draws of 1) and from 2 once (of 1): scoring a
    1 -> 5 draw, 1 scores 3·1/2 = 1.5 and 2 scores 1·1/1 = 1; scoring the 2 -> 5 draw, 1
    scores 3·2/3 = 2 and 2 has no other draw: every 5 decodes to 1. The 1 -> 1 draw is the
    only one to give 1: left out, 1 decodes as itself. Three of four."""
    assert loo([1, 1, 1, 2], [5, 5, 1, 5], {1: 3, 2: 1}) == 3
    # a rarer input with a surer channel wins: 3 -> 6 always (c = 2, 3 of 3 draws) against
    # 4 -> 6 once in 4 draws (c = 4): 2·2/2 = 2 > 4·1/4 = 1 for a 3-draw left out
    x = [3, 3, 3, 4, 4, 4, 4]
    y = [6, 6, 6, 6, 4, 4, 4]
    assert loo(x, y, {3: 2, 4: 4}) == 3 + 3  # the 3s, and 4's unchanged draws


def test_ties_go_to_the_output_itself_then_the_smaller_id():
    """Scoring a 3 -> 9 draw, 3 (its other draw) and 8 both score 1·1/1: the smaller id, 3,
    is right twice; scoring a 9 -> 9 draw, 9 and 4 both score 1: the output itself wins."""
    assert loo([3, 8, 3], [9, 9, 9], {3: 1, 8: 1}) == 2
    assert loo([9, 4, 9], [9, 9, 9], {9: 1, 4: 1}) == 2


def test_the_sample_is_the_shipped_file():
    s = ft.sample_sentences()
    assert len(s) >= 200 and all(line.isascii() for line in s)
    assert ft.sample_words() == sum(len(line.split()) for line in s) > 2500
    assert ft.SAMPLE_FILE.read_text().isascii()


@pytest.mark.parametrize("eta,first", [(30.0, True), (0.3, True), (4.0, False)])
def test_it_stops_once_the_interval_is_on_one_side(tiny_bundle, eta, first):
    """The tiny table at eta 30 returns everything (refused at the first step), at 0.3
    little (passes at the first step); eta 4 lies near the line and draws more."""
    m = ft.measure_text(DChiText(tiny_bundle, eta), np.random.default_rng(3))
    assert (m.draws == ft.TEXT_FIRST) == first
    assert m.tokens == 1102 and m.pieces == 3232 and m.words == ft.sample_words()
    if not first:
        assert m.draws in (2 * ft.TEXT_FIRST, m.tokens * ft.ROUNDS)


def test_special_tokens_are_not_measured(tiny_bundle):
    """[UNK] says nothing of the word it stands for: the tiny vocabulary reads 1,102 of the
    sample's 3,232 pieces; the rest are [UNK] and left out."""
    ids = ft.sample_ids(tiny_bundle)
    assert int((ids == tiny_bundle.special_ids["unk"]).sum()) == ids.size - 1102


def test_refusals_are_one_line_naming_what_to_do(tiny_bundle):
    weak = DChiText(tiny_bundle, 30.0)
    why = ft.text_floor_reason(weak, np.random.default_rng(0))
    assert why is not None and "\n" not in why
    assert why.startswith(f"bundle {tiny_bundle.bundle_id[:12]}… is unverified and weaker "
                          "than the text floor at eta=30: a context-free decoder recovers "
                          "100% of 1,024 tokens")
    assert why.endswith("use a bundle privbert knows, or trust this one with "
                        "--trusted-bundles once checked")
    assert ft.text_floor_reason(DChiText(tiny_bundle, 0.3), np.random.default_rng(0)) is None


def test_a_tokenizer_that_reads_too_little_is_refused(tiny_bundle):
    m = ft.TextMeasure(pieces=3232, words=2868, tokens=ft.MIN_TOKENS - 1, draws=0,
                       unchanged=0, decoded=0)
    why = ft.text_floor_reason(DChiText(tiny_bundle, 0.3), measured=m)
    assert why is not None and f"reads {ft.MIN_TOKENS - 1:,} of the public sample" in why
    fine = ft.TextMeasure(3232, 2868, ft.MIN_TOKENS, 1024, 0, 512)
    assert ft.text_floor_reason(DChiText(tiny_bundle, 0.3), measured=fine) is None
    over = ft.TextMeasure(3232, 2868, ft.MIN_TOKENS, 1024, 0, 513)  # 50.1% > the line
    assert "recovers 50.10% of 1,024" in ft.text_floor_reason(DChiText(tiny_bundle, 0.3),
                                                             measured=over)


def test_pieces_per_word_past_the_ratio_is_refused(tiny_bundle):
    words = 1000
    at = int(ft.PIECES_RATIO * ft.PUBLIC_PIECES_PER_WORD * words)
    ok = ft.TextMeasure(at, words, 900, 1024, 0, 0)
    assert ft.text_floor_reason(DChiText(tiny_bundle, 0.3), measured=ok) is None
    fine = ft.TextMeasure(at + 2, words, 900, 1024, 0, 0)
    why = ft.text_floor_reason(DChiText(tiny_bundle, 0.3), measured=fine)
    assert why is not None and "pieces per word" in why and "(limit 1.5 x)" in why


def test_the_line_holds_exactly_at_the_ratio_and_for_either_share(tiny_bundle):
    """33,807 pieces of 20,000 words is exactly PIECES_RATIO x the public model's (in the
    float arithmetic both edges use): it passes, one piece more does not. A bundle is also
    refused for what it sends unchanged, whatever is decoded."""
    mech = DChiText(tiny_bundle, 0.3)
    assert (33807 / 20000) / ft.PUBLIC_PIECES_PER_WORD == ft.PIECES_RATIO
    at = ft.TextMeasure(33807, 20000, 900, 1024, 0, 0)
    assert ft.text_floor_reason(mech, measured=at) is None
    why = ft.text_floor_reason(mech, measured=ft.TextMeasure(33808, 20000, 900, 1024, 0, 0))
    assert why is not None and "pieces per word" in why
    unchanged = ft.TextMeasure(3232, 2868, 900, 1024, 600, 400)
    why = ft.text_floor_reason(mech, measured=unchanged)
    assert why is not None and "recovers 39.06% of 1,024 tokens" in why
    assert "(58.59% sent unchanged; line 50.00%)" in why


class _Halves:
    """A channel that returns every other token unchanged and the rest as a token never seen
    before (decoded as itself: wrong): exactly half unchanged, half decoded, so the interval
    never leaves the line and every step is drawn (what the schedule is checked on; the real
    mechanism is checked above)."""

    def __init__(self, bundle):
        self.bundle, self.eta, self.sizes = bundle, 1.0, []
        seen = set(ft.sample_ids(bundle).tolist())
        self.fresh = iter([i for i in bundle.regular_ids.tolist() if i not in seen])

    def privatize_ids(self, x, rng):
        self.sizes.append(int(x.size))
        y = np.array(x)
        y[1::2] = [next(self.fresh) for _ in range(y[1::2].size)]
        return y


def test_the_steps_double_to_the_whole_sample_twice(minilm_bundle):
    m = _Halves(minilm_bundle)
    got = ft.measure_text(m, np.random.default_rng(0))  # type: ignore[arg-type]
    total = 2 * got.tokens
    assert m.sizes == [1024, 1024, 2048, total - 4096] and got.draws == total
