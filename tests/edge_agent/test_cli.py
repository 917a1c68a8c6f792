"""`edge-agent privatize` end to end (subprocess) for every mechanism, and bad input."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from edge_agent.cli import main
from shared.payload import parse_record
from tests.edge_agent.conftest import REPO, TEXTHIDE_KEY, assert_one_line_error, run_cli

LINES = ["the movie is good\t1", "bad plot , awful actor\t0", "\t1", "a very fun story\t1",
         "not boring !\t0"]

MECHS = [
    ("dchi-text", ["--eta", "5"], {"eta": 5.0}),
    ("dchi-embedding", ["--eta", "5", "--float16"], {"eta": 5.0}),
    ("laplace", ["--epsilon", "2", "--calibration", "coordinate", "--word-dropout", "0.1"],
     {"epsilon": 2.0, "calibration": "coordinate", "word_dropout": 0.1}),
    ("ome", ["--epsilon", "1", "--lam", "2"],
     {"epsilon": 1.0, "lam": 2.0, "int_bits": 4, "frac_bits": 5}),
    ("texthide", ["--m", "8", "--k", "2", "--texthide-key", TEXTHIDE_KEY], {"m": 8, "k": 2}),
    ("none", ["--allow-none"], {}),
]


def read_jsonl(path: Path) -> list:
    """Every line parses as a Record (the JSONL stays valid line by line)."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return [parse_record(line) for line in text.splitlines()]


@pytest.mark.parametrize(("mech", "flags", "params"), MECHS, ids=[m[0] for m in MECHS])
def test_privatize_every_mechanism(tmp_path, tiny_enc_dir, tiny_enc_bundle, mech, flags, params):
    src = tmp_path / "in.tsv"
    src.write_text("sentence\tlabel\n" + "\n".join(LINES) + "\n")
    out = tmp_path / "out.jsonl"
    proc = run_cli("privatize", str(src), "--tsv", "--mechanism", mech, *flags,
                   "--bundle", str(tiny_enc_dir), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    records = read_jsonl(out)
    assert len(records) == 4  # header skipped, one empty text skipped
    for rec in records:
        p = rec.payload
        assert p.mechanism == mech and p.bundle_id == tiny_enc_bundle.bundle_id
        assert p.params.model_dump() == params
    if mech == "texthide":
        assert all(len(r.label) == 2 and math.isclose(sum(r.label), 1) for r in records)
    else:
        assert [r.label for r in records] == [1, 0, 1, 0]
    summary = proc.stderr.strip().splitlines()[-1]
    assert summary.startswith("edge-agent: 4 records,") and "1 empty line(s) skipped" in summary
    assert "published" in summary and "holds" in summary


def test_stdin_no_labels_pairs_and_text_format(tiny_enc_dir, tmp_path):
    proc = run_cli("privatize", "-", "--eta", "4", "--bundle", str(tiny_enc_dir),
                   stdin=b"good movie\nbad plot\n")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all("label" not in json.loads(x) for x in lines)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("good movie\tfun plot\t1\nbad\tthe dull story\t0\n")
    proc = run_cli("privatize", str(pairs), "--tsv", "--eta", "4", "--bundle",
                   str(tiny_enc_dir))
    assert [parse_record(x).payload.segments for x in proc.stdout.splitlines()] == [[2, 2],
                                                                                    [1, 3]]
    proc = run_cli("privatize", str(pairs), "--tsv", "--eta", "1000", "--format", "text",
                   "--bundle", str(tiny_enc_dir), "--seed", "1", "--allow-weak-privacy")
    assert proc.returncode == 0, proc.stderr
    # at η = 1000 the noise (norm ~ 0.016) keeps every token: the text comes back, which
    # only --allow-weak-privacy permits, and the summary says so
    assert proc.stdout.splitlines() == ["good movie\tfun plot\t1", "bad\tthe dull story\t0"]
    assert "known the seed" in proc.stderr or "knows the seed" in proc.stderr
    assert "the output is close to the raw text" in proc.stderr.splitlines()[-1]


def test_import_and_cli_stay_torch_free(tmp_path, tiny_enc_dir):
    src = tmp_path / "in.txt"
    src.write_text("good movie\nbad plot\n")
    code = f"""
import sys
import edge_agent
light = not ({{"onnxruntime", "httpx", "matplotlib", "numpy"}} & set(sys.modules))
from edge_agent.cli import main
rcs = [main(["privatize", {str(src)!r}, "--eta", "5", "-o", {str(tmp_path / 'a')!r}]),
       main(["privatize", {str(src)!r}, "--eta", "5", "--bundle", {str(tiny_enc_dir)!r},
             "-o", {str(tmp_path / 'b')!r}])]
lazy = not ({{"onnxruntime", "httpx", "matplotlib"}} & set(sys.modules))
for mech in (["--mechanism", "laplace", "--epsilon", "1"],
             ["--mechanism", "ome", "--epsilon", "1", "--lam", "2"],
             ["--mechanism", "texthide", "--m", "2", "--texthide-key", {TEXTHIDE_KEY!r}],
             ["--mechanism", "dchi-embedding", "--eta", "3"]):
    rcs.append(main(["privatize", {str(src)!r}, *mech, "--bundle", {str(tiny_enc_dir)!r},
                     "-o", {str(tmp_path / 'c')!r}]))
rcs.append(main(["report", "--eta", "3", "--tokens", "5", "--samples", "10",
                 "--inversion-tokens", "50", "--bundle", {str(tiny_enc_dir)!r}]))
rcs.append(main(["bundle", "info", {str(tiny_enc_dir)!r}]))
print(rcs, light, lazy, "torch" in sys.modules, "transformers" in sys.modules)
"""
    proc = run_cli_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[0, 0, 0, 0, 0, 0, 0, 0] True True False False"


def run_cli_python(code: str):
    import os
    import subprocess

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)


# -- bad input: one line, no traceback, non-zero exit, earlier lines kept --------------------------
def call(capfd, *argv: str) -> tuple[int, str]:
    """main(argv) in process; (exit code, stderr). SystemExit from argparse counts too."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    err = capfd.readouterr().err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if not x.startswith("edge-agent: warning:")]
    assert len(lines) == 1 and lines[0].startswith("edge-agent: error:"), err
    return rc, lines[0]


@pytest.fixture
def tiny(tiny_enc_dir) -> list[str]:
    return ["--bundle", str(tiny_enc_dir)]


def test_missing_file_and_directory(capfd, tmp_path, tiny):
    rc, msg = call(capfd, "privatize", str(tmp_path / "nope.txt"), "--eta", "5", *tiny)
    assert rc == 1 and "no such file" in msg
    rc, msg = call(capfd, "privatize", str(tmp_path), "--eta", "5", *tiny)
    assert rc == 1 and "is a directory" in msg
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    rc, msg = call(capfd, "privatize", str(src), "--eta", "5", "-o", str(tmp_path), *tiny)
    assert rc == 1 and "is a directory" in msg
    rc, msg = call(capfd, "privatize", str(src), "--eta", "5", "--bundle", str(tmp_path / "b"))
    assert rc == 1 and "no such bundle" in msg


def test_non_utf8_keeps_earlier_lines(capfd, tmp_path, tiny):
    src = tmp_path / "in.txt"
    src.write_bytes(b"good movie\nbad plot\nfun \xff\xfe story\nthe end\n")
    out = tmp_path / "out.jsonl"
    rc, msg = call(capfd, "privatize", str(src), "--eta", "5", "-o", str(out), *tiny)
    assert rc == 1 and "line 3: not valid UTF-8" in msg and "2 record(s)" in msg
    assert len(read_jsonl(out)) == 2


def test_non_utf8_late_in_a_big_file(tmp_path, tiny_enc_dir):
    """The bad line comes after several batches: all of them are on disk."""
    src = tmp_path / "in.txt"
    src.write_bytes(b"good movie\n" * 300 + b"\xc3\x28 bad\n" + b"fun\n" * 10)
    out = tmp_path / "out.jsonl"
    proc = run_cli("privatize", str(src), "--eta", "5", "-o", str(out), "--batch-size", "64",
                   "--bundle", str(tiny_enc_dir))
    assert_one_line_error(proc, 1, "line 301: not valid UTF-8")
    assert len(read_jsonl(out)) == 300


def test_empty_lines_skipped_or_refused(capfd, tmp_path, tiny):
    src = tmp_path / "in.txt"
    src.write_text("good\n\n   \nbad\n")
    out = tmp_path / "out.jsonl"
    assert main(["privatize", str(src), "--eta", "5", "-o", str(out), *tiny]) == 0
    assert "2 empty line(s) skipped" in capfd.readouterr().err
    assert len(read_jsonl(out)) == 2
    rc, msg = call(capfd, "privatize", str(src), "--eta", "5", "--empty", "error", "-o",
                   str(out), *tiny)
    assert rc == 1 and "line 2: empty line" in msg
    assert len(read_jsonl(out)) == 1


def test_over_long_lines(capfd, tmp_path, tiny):
    src = tmp_path / "in.txt"
    long = "the a movie film good bad great awful is was not very fun"  # 13 word pieces
    src.write_text(f"good\n{long}\nbad\n")
    out = tmp_path / "out.jsonl"
    assert main(["privatize", str(src), "--eta", "5", "--max-length", "8", "-o", str(out),
                 *tiny]) == 0
    assert "1 truncated" in capfd.readouterr().err
    assert [r.payload.n_tokens for r in read_jsonl(out)] == [1, 6, 1]
    rc, msg = call(capfd, "privatize", str(src), "--eta", "5", "--max-length", "8",
                   "--truncate", "error", "-o", str(out), *tiny)
    assert rc == 1 and "line 2 has 13 tokens" in msg and "at most 6" in msg
    assert len(read_jsonl(out)) == 1


@pytest.mark.parametrize(("argv", "needle"), [
    (["--eta", "0"], "eta must be a finite number > 0"),
    (["--eta", "-3"], "eta must be a finite number > 0"),
    (["--eta", "nan"], "eta must be a finite number > 0"),
    ([], "needs --eta"),
    (["--mechanism", "laplace", "--epsilon", "1", "--word-dropout", "1"],
     "word_dropout must be in [0, 1)"),
    (["--mechanism", "laplace", "--epsilon", "0"], "epsilon must be a finite number > 0"),
    (["--mechanism", "ome", "--epsilon", "1", "--lam", "0"], "lam must be a finite number > 0"),
    (["--mechanism", "texthide", "--m", "4", "--k", "0"], "k must be an integer >= 1"),
    (["--mechanism", "texthide", "--m", "0"], "m must be an integer >= 1"),
    (["--mechanism", "none"], "--allow-none"),
    (["--mechanism", "laplace", "--epsilon", "1", "--eta", "3"], "--eta do(es) not apply"),
    (["--mechanism", "laplace", "--epsilon", "1", "--format", "text"], "--format text"),
    (["--mechanism", "rot13"], "invalid choice"),
    (["--eta", "5", "--max-length", "2"], "max_length must be an integer in [4, 64]"),
    (["--eta", "5", "--post", "predict"], "--post predict needs --server"),
])
def test_invalid_parameters(capfd, tmp_path, tiny, argv, needle):
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    out = tmp_path / "out.jsonl"
    rc, msg = call(capfd, "privatize", str(src), *argv, *tiny, "-o", str(out))
    assert rc == 2 and needle in msg, msg
    assert not out.exists()  # nothing written for a usage error


def test_vector_mechanism_needs_an_encoder(capfd, tmp_path, tiny_model_dir):
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    rc, msg = call(capfd, "privatize", str(src), "--mechanism", "ome", "--epsilon", "1",
                   "--lam", "2", "--bundle", str(tiny_model_dir))
    assert rc == 2 and "encoder.onnx" in msg


def test_tsv_errors_name_the_line(capfd, tmp_path, tiny):
    src = tmp_path / "in.tsv"
    src.write_text("good\t1\nbad\t0\nno label here\nfun\t1\n")
    out = tmp_path / "out.jsonl"
    rc, msg = call(capfd, "privatize", str(src), "--tsv", "--eta", "5", "-o", str(out), *tiny)
    assert rc == 1 and "line 3: expected text<TAB>label" in msg
    assert [r.label for r in read_jsonl(out)] == [1, 0]
    src.write_text("good\t1\nbad\tnot a label!\n")
    rc, msg = call(capfd, "privatize", str(src), "--tsv", "--eta", "5", "-o", str(out), *tiny)
    assert rc == 1 and "line 2: the label column has 12 character(s)" in msg
    assert "not a label" not in msg  # the column is described, never echoed
    src.write_text("good\t1\nbad\t7\n")
    rc, msg = call(capfd, "privatize", str(src), "--tsv", "--mechanism", "texthide", "--m", "2",
                   "--k", "2", "--texthide-key", TEXTHIDE_KEY, "-o", str(out), *tiny)
    assert rc == 1 and "line 2: texthide mixes labels" in msg


def test_corrupted_bundle_is_refused(capfd, tmp_path, tiny_enc_bundle):
    d = tiny_enc_bundle.save(tmp_path / "bundle")
    raw = bytearray((d / "embeddings.npy").read_bytes())
    raw[-1] ^= 0xFF
    (d / "embeddings.npy").write_bytes(bytes(raw))
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    rc, msg = call(capfd, "privatize", str(src), "--eta", "5", "--bundle", str(d))
    assert rc == 1 and "embeddings.npy" in msg and "hash" in msg
