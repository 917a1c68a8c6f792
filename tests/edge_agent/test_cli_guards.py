"""`edge-agent` guards: error messages never echo input text, -o on the input file,
flags given as 0, integer label bounds, TextHide with fewer than k lines, report --eta inf."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edge_agent.cli import main
from tests.edge_agent.conftest import REPO, TEXTHIDE_KEY, assert_one_line_error, run_cli
from tests.edge_agent.test_cli import read_jsonl

MARK = "zqxleakmarker"


def run_main(capfd, *argv: str) -> tuple[int, str, str]:
    """main(argv) in process: (exit code, stdout, stderr); SystemExit counts."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    out, err = capfd.readouterr()
    return rc, out, err


def one_error(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if not x.startswith("edge-agent: warning:")]
    assert len(lines) == 1 and lines[0].startswith("edge-agent: error:"), err
    return lines[0]


# -- 1. no error path echoes the input ------------------------------------------------------------
TH = ["--mechanism", "texthide", "--m", "2", "--k", "2", "--texthide-key", TEXTHIDE_KEY]
LEAK_CASES = {
    "swapped-columns": (f"1\tmy {MARK} is private\n".encode(), ["--tsv"], "label column"),
    "label-not-a-name": (f"good\t{MARK}!\n".encode(), ["--tsv"], "label column"),
    "label-too-long": (f"good\t{MARK * 6}\n".encode(), ["--tsv"], "label column"),
    "columns": (f"good\t1\na\tb\t{MARK}\t1\n".encode(), ["--tsv"], "found 4 column"),
    "columns-change": (f"good\t1\n{MARK}\tb\t1\n".encode(), ["--tsv"], "3 columns"),
    "utf8": (f"good\n{MARK} \xff ok\n".encode("latin-1"), [], "not valid UTF-8"),
    "too-long": (f"good\n{' '.join([MARK] * 40)}\n".encode(),
                 ["--max-length", "8", "--truncate", "error"], "tokens"),
    "int-label": (f"{MARK}\t99999999999999999999999\n".encode(), ["--tsv"], "out of range"),
    "texthide-label": (f"good\t1\n{MARK}\t7\n".encode(), ["--tsv", *TH], "mixes labels"),
    "texthide-short": (f"{MARK}\t1\n".encode(), ["--tsv", *TH], "only 1 remain"),
    "empty-error": (f"{MARK}\n\nmore\n".encode(), ["--empty", "error"], "empty line"),
}


@pytest.mark.parametrize("case", sorted(LEAK_CASES))
def test_error_paths_never_echo_input(capfd, tmp_path, tiny_enc_dir, case):
    """A unique marker word in the bad field: not in stdout, not in stderr."""
    data, flags, needle = LEAK_CASES[case]
    src = tmp_path / "in.txt"
    src.write_bytes(data)
    if "--mechanism" not in flags:
        flags = [*flags, "--eta", "5"]
    rc, out, err = run_main(capfd, "privatize", str(src), *flags, "--bundle",
                            str(tiny_enc_dir), "--no-progress")
    assert rc == 1, err
    assert needle in one_error(err)
    assert MARK not in (out + err).lower()


def test_report_sample_errors_never_echo_input(capfd, tmp_path, tiny_enc_dir):
    src = tmp_path / "sample.txt"
    src.write_bytes(f"good\n{MARK} \xfe\n".encode("latin-1"))
    rc, out, err = run_main(capfd, "report", "--eta", "3", "--sample", str(src), "--bundle",
                            str(tiny_enc_dir))
    assert rc == 1 and "line 2: not valid UTF-8" in one_error(err)
    assert MARK not in out + err


# -- 2. -o on the input ---------------------------------------------------------------------------
def test_output_on_the_input_file_is_refused(capfd, tmp_path, tiny_enc_dir):
    src = tmp_path / "in.txt"
    data = b"good movie\nbad plot\n" * 50
    src.write_bytes(data)
    link = tmp_path / "link.txt"
    link.symlink_to(src)
    hard = tmp_path / "hard.txt"
    os.link(src, hard)
    for out in (src, link, hard, f"{tmp_path}/./in.txt"):
        rc, stdout, err = run_main(capfd, "privatize", str(src), "--eta", "5", "-o", str(out),
                                   "--bundle", str(tiny_enc_dir))
        assert rc == 2, err
        assert "is the input file" in one_error(err) and stdout == ""
        assert src.read_bytes() == data  # untouched
    # standard input redirected from the output file: the same inode
    with open(src, "rb") as stdin:
        proc = subprocess.run([sys.executable, "-m", "edge_agent", "privatize", "-", "--eta",
                               "5", "-o", str(src), "--bundle", str(tiny_enc_dir)],
                              stdin=stdin, capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert_one_line_error(proc, 2, "is the input on stdin")
    assert src.read_bytes() == data
    # another file is fine, and /dev/null to /dev/null is not a regular file
    other = tmp_path / "out.jsonl"
    assert main(["privatize", str(src), "--eta", "5", "-o", str(other), "--bundle",
                 str(tiny_enc_dir)]) == 0
    assert len(read_jsonl(other)) == 100
    assert main(["privatize", os.devnull, "--eta", "5", "-o", os.devnull, "--bundle",
                 str(tiny_enc_dir)]) == 0


# -- 10. flags given as 0 for another mechanism ---------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--mechanism", "laplace", "--epsilon", "1", "--eta", "0"],
    ["--eta", "5", "--word-dropout", "0"],
    ["--eta", "5", "--epsilon", "0"],
    ["--eta", "5", "--lam", "0"],
    ["--mechanism", "ome", "--epsilon", "1", "--lam", "2", "--k", "0"],
    ["--eta", "5", "--m", "0"],
], ids=["eta", "word-dropout", "epsilon", "lam", "k", "m"])
def test_zero_valued_flag_of_another_mechanism(capfd, tmp_path, tiny_enc_dir, argv):
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    out = tmp_path / "out.jsonl"
    rc, _, err = run_main(capfd, "privatize", str(src), *argv, "--bundle", str(tiny_enc_dir),
                          "-o", str(out))
    assert rc == 2 and "do(es) not apply to --mechanism" in one_error(err)
    assert not out.exists()


@pytest.mark.parametrize("argv", [["--eta", "inf"], ["--eta=-inf"], ["--eta", "nan"],
                                  ["--eta", "3", "--etas", "50,inf"]])
def test_report_needs_a_finite_eta(capfd, tiny_enc_dir, argv):
    rc, _, err = run_main(capfd, "report", *argv, "--bundle", str(tiny_enc_dir))
    assert rc == 2 and "finite number" in one_error(err)


# -- 5. integer labels are int32 ------------------------------------------------------------------
def test_huge_integer_label_names_the_line_and_keeps_earlier_ones(tmp_path, tiny_enc_dir):
    src = tmp_path / "in.tsv"
    src.write_text("good movie\t1\nbad plot\t0\nfun\t99999999999999999999999\nmore\t1\n")
    out = tmp_path / "out.jsonl"
    proc = run_cli("privatize", str(src), "--tsv", "--eta", "5", "-o", str(out), "--bundle",
                   str(tiny_enc_dir))
    line = assert_one_line_error(proc, 1, "line 3: integer label")
    assert "out of range" in line and "2 record(s) before it were written" in line
    assert [r.label for r in read_jsonl(out)] == [1, 0]


# -- 9. TextHide with fewer than k lines left -----------------------------------------------------
def test_texthide_fewer_than_k_lines(capfd, tmp_path, tiny_enc_dir):
    src = tmp_path / "in.tsv"
    src.write_text("good\t1\nbad\t0\nfun\t1\n")
    out = tmp_path / "out.jsonl"
    flags = ["--tsv", "--mechanism", "texthide", "--m", "4", "--k", "4", "--texthide-key",
             TEXTHIDE_KEY, "--bundle", str(tiny_enc_dir), "-o", str(out)]
    rc, _, err = run_main(capfd, "privatize", str(src), *flags)
    msg = one_error(err)
    assert rc == 1 and "texthide --k 4 mixes 4 labelled lines; only 3 remain (lines 1-3)" in msg
    assert "0 record(s) before it were written" in msg
    # a later batch loses lines without tokens (control characters only): earlier records kept
    lines = [f"good movie {i}\t{i % 2}" for i in range(16)] + [
        "fun plot\t1", "\x07\t0", "\x01\x02\t1", "dull story\t0"]
    src.write_text("\n".join(lines) + "\n")
    rc, _, err = run_main(capfd, "privatize", str(src), *flags, "--no-progress")
    msg = one_error(err)
    assert rc == 1 and "only 2 remain (lines 17-20)" in msg
    assert "16 record(s) before it were written" in msg
    assert len(read_jsonl(out)) == 16
