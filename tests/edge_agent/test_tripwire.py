"""Tripwire: raw text must never leave the device.

Sentences carry unique marker words. After privatization and serialisation the
marker may not appear anywhere in what the CLI prints (stdout and stderr), and
the markers' token ids may not appear in any payload array, for dchi-embedding,
laplace, ome and texthide. For dchi-text a marker can only come back when each
of its word pieces happens to be left unchanged: the test measures each piece's
unchanged rate in the CLI output against the mechanism's own rate (simulated
with DChiText directly) and the whole-marker survival against the product of
those rates, each within 5 binomial standard deviations (+1 count). These runs draw
afresh for every line (--no-memo): the same sentence is repeated 100 times.

The device's privacy ledger (and its memo key) may not hold the markers either: it keeps a
keyed hash of each text and the payload sent for it, never the text.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from shared.mechanisms import DChiText
from shared.payload import parse_record
from tests.edge_agent.conftest import TEXTHIDE_KEY, run_cli

MARKERS = ["zqxmarker123", "blorptastic987", "vexquillion55"]
PER_MARKER = 100
ETA = 65.0


def sentences() -> list[str]:
    return [f"my secret word is {MARKERS[i % 3]} and nobody knows it"
            for i in range(3 * PER_MARKER)]


def run_privatize(tmp_path, *flags: str, lines: list[str] | None = None):
    src = tmp_path / "secrets.txt"
    src.write_text("\n".join(lines or sentences()) + "\n")
    proc = run_cli("privatize", str(src), *(flags if lines else ("--no-memo", *flags)))
    assert proc.returncode == 0, proc.stderr
    return proc, [parse_record(x) for x in proc.stdout.splitlines()]


def contains_run(haystack: bytes, ids: list[int]) -> bool:
    return np.asarray(ids, dtype="<i4").tobytes() in haystack


@pytest.mark.parametrize("flags", [
    ["--mechanism", "dchi-embedding", "--eta", str(ETA)],
    ["--mechanism", "laplace", "--epsilon", "1"],
    ["--mechanism", "ome", "--epsilon", "1", "--lam", "2"],
    ["--mechanism", "texthide", "--m", "16", "--texthide-key", TEXTHIDE_KEY],
], ids=["dchi-embedding", "laplace", "ome", "texthide"])
def test_no_marker_leaves(tmp_path, minilm_enc_dir, minilm_enc_bundle, flags):
    proc, records = run_privatize(tmp_path, *flags, "--bundle", str(minilm_enc_dir))
    assert len(records) == len(sentences())
    printed = (proc.stdout + proc.stderr).lower()
    tok = minilm_enc_bundle.tokenizer
    for marker in MARKERS:
        assert marker not in printed
        pieces = tok.encode(marker, add_special_tokens=False)
        assert len(pieces.ids) >= 3  # a made-up word: several word pieces
        for rec in records:
            assert not contains_run(rec.payload.data_array().tobytes(), pieces.ids)
    if flags[1] == "dchi-embedding":
        # no perturbed row is (numerically) an embedding of the table: the noise was added
        emb = minilm_enc_bundle.embeddings
        rows = np.concatenate([r.payload.data_array() for r in records]).astype(np.float64)
        nearest = DChiText(minilm_enc_bundle, ETA).index.search(rows)
        assert np.linalg.norm(rows - emb[nearest], axis=1).min() > 1e-2


def test_dchi_text_markers_survive_only_at_the_mechanism_rate(tmp_path, minilm_bundle):
    proc, records = run_privatize(tmp_path, "--mechanism", "dchi-text", "--eta", str(ETA))
    printed_err = proc.stderr.lower()
    assert not any(m in printed_err for m in MARKERS)
    tok = minilm_bundle.tokenizer
    mech = DChiText(minilm_bundle, ETA)
    sim_rng = np.random.default_rng(12345)
    k_sim = 1000
    for j, marker in enumerate(MARKERS):
        sent_ids = tok.encode(sentences()[j], add_special_tokens=False).ids
        pieces = tok.encode(marker, add_special_tokens=False).ids
        start = next(i for i in range(len(sent_ids)) if sent_ids[i : i + len(pieces)] == pieces)
        outs = np.stack([r.payload.data_array() for r in records[j::3]])  # (100, L)
        assert outs.shape == (PER_MARKER, len(sent_ids))
        window = outs[:, start : start + len(pieces)]
        # each piece's unchanged rate in the CLI output vs the mechanism's, simulated
        sim = mech.privatize_ids(np.repeat(pieces, k_sim), sim_rng).reshape(len(pieces), k_sim)
        p = (sim == np.array(pieces)[:, None]).mean(axis=1)
        observed = (window == np.array(pieces)[None, :]).mean(axis=0)
        for pi, oi in zip(p, observed, strict=True):
            sd = math.sqrt(max(pi * (1 - pi), 1e-4) / PER_MARKER)
            assert abs(oi - pi) <= 5 * sd + 1 / PER_MARKER, (marker, p, observed)
        # whole marker back in the decoded text: at most what independent pieces allow
        survive = float(np.prod(p))
        back = sum(marker in tok.decode(o.tolist()).replace(" ", "")
                   for o in window)
        bound = PER_MARKER * survive + 5 * math.sqrt(PER_MARKER * survive * (1 - survive)) + 1
        assert back <= bound, (marker, back, survive)


@pytest.mark.parametrize("flags", [
    ["--mechanism", "dchi-text", "--eta", "5"],
    ["--mechanism", "laplace", "--epsilon", "1"],
], ids=["dchi-text", "laplace"])
def test_the_ledger_holds_no_raw_text(tmp_path, tiny_enc_dir, tiny_enc_bundle, flags):
    """Memoized runs (the default): every byte of the ledger's folder (the SQLite file, any
    WAL, the memo key) is free of the markers and of the sentences' other words, in UTF-8
    and UTF-16, while the memo holds one entry per distinct token sequence (the markers are
    [UNK] in the tiny vocabulary: what is sent for those sentences is the same). The ledger
    never sees texts, only keyed hashes of token ids and payloads."""
    import sqlite3

    ledger = Path(os.environ["PRIVBERT_LEDGER"])
    lines = sentences()[:9]
    _, records = run_privatize(tmp_path, *flags, "--bundle", str(tiny_enc_dir), lines=lines)
    assert len(records) == 9
    with sqlite3.connect(ledger) as db:
        tok = tiny_enc_bundle.text_tokenizer()
        distinct = {tuple(tok.encode(ln, add_special_tokens=False).ids) for ln in lines}
        assert db.execute("SELECT count(*) FROM memo").fetchone()[0] == len(distinct)
    blob = b"".join(p.read_bytes() for p in ledger.parent.iterdir() if p.is_file())
    assert len(blob) > 4096
    for word in [*MARKERS, "nobody knows", "secret word"]:
        for w in (word, word.upper(), word.capitalize()):
            for enc in ("utf-8", "utf-16-le", "utf-16-be"):
                assert w.encode(enc) not in blob, (word, enc)
