"""Truncation at the boundary (issue 42: a one-line slip there went unseen): with
``--truncate error`` a text of exactly the longest allowed length (max_length - 2 word pieces,
or max_length - 3 for a sentence pair) is accepted whole by both edges, byte-identical for a
seed, and one piece more is refused by both in one line, nothing written for it."""

from __future__ import annotations

import pytest

from tests.web_edge.conftest import js_edge, py_edge

WORDS = ["the", "movie", "was", "good", "fun", "film", "plot", "story", "dull"]  # one piece each
MAX_LENGTH = 9  # single: 7 pieces; pair: 6


@pytest.mark.parametrize("pair", [False, True])
def test_the_longest_text_is_accepted_whole_and_one_piece_more_refused(tiny_dir, tmp_path,
                                                                       pair):
    budget = MAX_LENGTH - (3 if pair else 2)
    words = WORDS[:budget]
    fits = ("\t".join([" ".join(words[:3]), " ".join(words[3:]), "1"]) if pair
            else " ".join(words))
    over = ("\t".join([" ".join(words[:3]), " ".join(words[3:] + ["plot"]), "1"]) if pair
            else " ".join(words + ["plot"]))
    flags = ["--eta", "5", "--bundle", str(tiny_dir), "--truncate", "error", "--max-length",
             str(MAX_LENGTH), "--seed", "11", *(["--tsv", "--header", "no"] if pair else [])]
    ok = tmp_path / "ok.txt"
    ok.write_text(fits + "\n")
    js = js_edge("privatize", str(ok), *flags, "-o", str(tmp_path / "js.jsonl"), tmp=tmp_path)
    py = py_edge("privatize", str(ok), *flags, "--no-progress", "-o",
                 str(tmp_path / "py.jsonl"), tmp=tmp_path)
    assert js.returncode == 0, js.stderr
    assert py.returncode == 0, py.stderr
    lines = (tmp_path / "py.jsonl").read_text().splitlines()
    assert len(lines) == 1 and (tmp_path / "js.jsonl").read_text().splitlines() == lines
    assert f'"shape":[{budget}]' in lines[0]  # whole: every piece, none cut
    bad = tmp_path / "bad.txt"
    bad.write_text(fits + "\n" + over + "\n")
    for run, prog in ((js_edge, "privbert-edge"), (py_edge, "edge-agent")):
        out = tmp_path / f"{prog}.jsonl"
        p = run("privatize", str(bad), *flags, "-o", str(out), tmp=tmp_path)
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith(f"{prog}: error:")]
        assert p.returncode == 1 and len(errors) == 1, p.stderr
        assert f"line 2 has {budget + 1} tokens" in errors[0], errors[0]
        assert len(out.read_text().splitlines()) == 1  # the line before it, whole
