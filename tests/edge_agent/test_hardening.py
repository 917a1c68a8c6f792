"""Hardening with the real CLI (a subprocess of `python -m edge_agent`): the privacy floor,
uncomputable parameters, output valid line by line after a write failure, an idle pipe,
exact flags, TSV header and label warnings, report --plot checked first."""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time

import pytest

from tests.edge_agent.conftest import REPO, TEXTHIDE_KEY, assert_one_line_error, run_cli

TEXT = b"good movie\nthe plot was boring and dull\na very funny story\n"


@pytest.fixture
def src(tmp_path):
    p = tmp_path / "in.txt"
    p.write_bytes(TEXT)
    return p


@pytest.mark.parametrize(("flags", "needle", "floor"), [
    (["--eta", "1e308"], "worst-case epsilon per token (eta x 2 max||phi||) is not finite",
     True),
    (["--mechanism", "dchi-embedding", "--eta", "1000"], "tokens drawn at random were their own nearest",
     True),
    (["--eta", "1000", "--format", "text"], "tokens drawn at random came back unchanged", True),
    (["--mechanism", "laplace", "--epsilon", "1e300"], "within float32 rounding", True),
    (["--mechanism", "ome", "--epsilon", "1", "--lam", "1e20"], "is not finite", True),
    (["--mechanism", "ome", "--epsilon", "1", "--lam", "1e6"], "fixed function", True),
    (["--eta", "1e-40"], "eta=1e-40 is too small to compute", False),
    (["--mechanism", "dchi-embedding", "--eta", "1e-40"], "overflows float32", False),
    (["--mechanism", "dchi-embedding", "--eta", "0.001", "--float16"],
     "overflows a float16 payload", False),
    (["--mechanism", "laplace", "--epsilon", "1e-40"], "epsilon=1e-40 is too small", False),
    (["--mechanism", "texthide", "--m", "1000000000000", "--texthide-key", TEXTHIDE_KEY],
     "m=1000000000000 is too large", False),
], ids=["eta-inf-worst", "emb-weak", "text-weak", "laplace-weak", "ome-lam-inf", "ome-lam",
        "eta-tiny", "emb-tiny", "emb-float16", "laplace-tiny", "texthide-m"])
def test_weak_or_uncomputable_parameters_are_refused_before_any_work(
        flags, needle, floor, src, tmp_path, tiny_enc_dir):
    out = tmp_path / "out.jsonl"
    proc = run_cli("privatize", str(src), *flags, "--bundle", str(tiny_enc_dir), "-o", str(out))
    line = assert_one_line_error(proc, code=2, contains=needle)
    assert ("--allow-weak-privacy" in line) is floor
    assert "Warning" not in proc.stderr and "MemoryError" not in proc.stderr
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("flags", [["--eta", "1000"], ["--mechanism", "ome", "--epsilon", "1",
                                                       "--lam", "1e6"]])
def test_allow_weak_privacy_says_the_output_is_close_to_the_raw_text(flags, src, tiny_enc_dir):
    proc = run_cli("privatize", str(src), *flags, "--bundle", str(tiny_enc_dir),
                   "--allow-weak-privacy")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 3
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("edge-agent: warning:") and "privacy floor" in lines[0]
    assert "the output is close to the raw text" in lines[0]
    assert "WEAK PRIVACY (--allow-weak-privacy): the output is close to the raw text" in \
        lines[-1]


# -- output valid line by line after a write failure -----------------------------------------
# The file size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, no SIGXFSZ) binds every
# file of the process, the privacy ledger too, which is charged before each batch is
# written. So the limit is applied when the output is opened (a hook on Output._open, in the
# real CLI process), after a first run of the same input and seed charged the ledger and
# memoized every text: the limited run's charges find every text memoized and write nothing
# to the ledger, and its output is the first run's, byte for byte.
_LIMITED = """
import resource, signal, sys
from edge_agent.privatize import files
from edge_agent.cli import main
_open = files.Output._open
def _limited(self):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    return _open(self)
files.Output._open = _limited
sys.exit(main(["privatize", *sys.argv[1:]]))
"""


def privatize_limited(args: list[str], limit: int, stdout=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EDGE_AGENT_DEBUG", None)
    out = {"stdout": stdout, "stderr": subprocess.PIPE} if stdout is not None else \
        {"capture_output": True}
    return subprocess.run([sys.executable, "-c", _LIMITED.format(limit=limit), *args],
                          text=True, cwd=REPO, env=env, timeout=120, **out)


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_write_failure_at_any_byte_leaves_complete_lines_and_says_how_many(
        fmt, tmp_path, tiny_enc_dir):
    """The file is cut back to its last complete line, every line parses, the lines are the
    start of the full output (same seed), and the message names the file and the count."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"good movie number {i}\n" for i in range(300)))
    common = [str(src), "--eta", "5", "--seed", "7", "--bundle", str(tiny_enc_dir),
              "--format", fmt]
    full_path = tmp_path / "full"
    assert privatize_limited([*common, "-o", str(full_path)], 10**9).returncode == 0
    full = full_path.read_bytes().splitlines(keepends=True)
    size = sum(map(len, full))
    boundary = sum(map(len, full[:40]))
    for limit in (1, len(full[0]) - 1, boundary, boundary + 1, size - 1):
        out = tmp_path / f"out{limit}"
        proc = privatize_limited([*common, "-o", str(out)], limit)
        line = assert_one_line_error(proc, code=1, contains=f"{out}: write failed")
        data = out.read_bytes()
        kept = data.splitlines(keepends=True)
        assert data == b"".join(full[: len(kept)]), limit  # whole lines, the run's own
        assert len(data) <= limit and (not data or data.endswith(b"\n"))
        assert f"it holds {len(kept)} complete record(s)" in line
        if fmt == "jsonl":
            assert all(json.loads(x)["payload"]["mechanism"] == "dchi-text" for x in kept)
        else:
            assert all(x.decode().strip() for x in kept)


@pytest.mark.parametrize("mode", ["append", "after-earlier-output"])
def test_write_failure_on_stdout_redirected_to_a_file_keeps_what_was_there(
        mode, tmp_path, tiny_enc_dir):
    """stdout is a regular file (`>> out` or `{ echo ...; edge-agent ...; } > out`): the
    cut goes back to this run's last complete line, after what the file held before (an
    appending descriptor's offset stays 0: the cut used to destroy the earlier content)."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"good movie number {i}\n" for i in range(300)))
    out = tmp_path / "out.txt"
    old = b"an earlier run's line\n" * 3
    out.write_bytes(old)
    args = [str(src), "--eta", "5", "--seed", "7", "--bundle", str(tiny_enc_dir), "--format",
            "text"]
    assert privatize_limited([*args, "-o", os.devnull], 10**9).returncode == 0  # memoized
    # as a shell opens them: `>>` is O_APPEND at offset 0 (Python's "ab" would seek)
    fd = os.open(out, os.O_WRONLY | (os.O_APPEND if mode == "append" else 0))
    try:
        if mode != "append":
            os.lseek(fd, len(old), os.SEEK_SET)
        proc = privatize_limited(args, len(old) + 1000, stdout=fd)
    finally:
        os.close(fd)
    line = assert_one_line_error(proc, code=1, contains="stdout: write failed")
    data = out.read_bytes()
    assert data.startswith(old) and data.endswith(b"\n")
    mine = data[len(old):].splitlines()
    assert 0 < len(mine) < 300 and all(x.strip() for x in mine)
    assert f"it holds {len(mine)} complete record(s), cut back" in line


def test_dev_full_is_reported_with_the_file_and_zero_records(src, tiny_enc_dir):
    proc = run_cli("privatize", str(src), "--eta", "5", "--bundle", str(tiny_enc_dir), "-o",
                   "/dev/full")
    assert_one_line_error(proc, code=1, contains="/dev/full: write failed (No space left on "
                                                 "device); it holds 0 complete record(s)")


# -- an idle pipe -------------------------------------------------------------------------------
def read_line(proc: subprocess.Popen, timeout: float) -> bytes | None:
    buf = b""
    start = time.perf_counter()
    while not buf.endswith(b"\n"):
        left = timeout - (time.perf_counter() - start)
        if left <= 0:
            return None
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            buf += chunk
    return buf


def test_a_record_from_an_idle_pipe_comes_out_within_100_ms(tiny_enc_dir):
    """Lines written one at a time to stdin come out one at a time, without waiting for
    a full batch or EOF; the median delay is under 100 ms (the issue's target)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "edge_agent", "privatize", "-", "--eta", "5",
                             "--bundle", str(tiny_enc_dir), "--no-progress"], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"good movie\n")
        proc.stdin.flush()
        assert read_line(proc, 60) is not None  # start-up (bundle, tokenizer)
        delays = []
        for i in range(7):
            time.sleep(0.1)
            start = time.perf_counter()
            proc.stdin.write(f"a funny story {i}\n".encode())
            proc.stdin.flush()
            line = read_line(proc, 5)
            assert line is not None, "no record before EOF: the partial batch was held back"
            delays.append(time.perf_counter() - start)
            assert json.loads(line)["payload"]["mechanism"] == "dchi-text"
        assert statistics.median(delays) < 0.1, delays
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == 0


# -- flags, TSV warnings, report --plot ------------------------------------------------------
@pytest.mark.parametrize("argv", [["privatize", "IN", "--et", "5"],
                                  ["privatize", "IN", "--eta", "5", "--bund", "x"],
                                  ["report", "--eta", "3", "--et", "5"]])
def test_abbreviated_flags_are_refused(argv, src):
    proc = run_cli(*[str(src) if a == "IN" else a for a in argv])
    assert_one_line_error(proc, code=2, contains="unrecognized arguments: --")


@pytest.mark.parametrize(("content", "warned"), [
    ("sentence\tscore\ngood movie\t1\nbad plot\t0\n", "line 1 looks like a header"),
    ("sentence\tlabel\ngood movie\t1\nbad plot\t0\n", None),  # a real header: skipped
    ("good movie\tpos\nbad plot\tneg\nfun story\tpos\n", None),  # line 1's label recurs
    ("good movie\t1\nbad plot\tneg\nfun story\t0\n", "labels of mixed kinds: integers (first "
     "on line 1) and class names (first on line 2)"),
    ("sentence\tscore\ngood movie\tpos\nbad plot\t1\n", "labels of mixed kinds"),
], ids=["header-like", "label-header", "names", "mixed", "header-and-mixed"])
def test_tsv_header_and_mixed_label_warnings(content, warned, tmp_path, tiny_enc_dir):
    p = tmp_path / "in.tsv"
    p.write_text(content)
    proc = run_cli("privatize", str(p), "--tsv", "--eta", "5", "--bundle", str(tiny_enc_dir))
    assert proc.returncode == 0, proc.stderr
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("edge-agent: warning:")]
    if warned is None:
        assert warnings == []
    else:
        assert any(warned in w for w in warnings), proc.stderr
        assert "score" not in proc.stderr and "pos" not in proc.stderr  # never quotes input


def test_report_plot_path_is_checked_before_any_computation(tmp_path, tiny_model_dir):
    for target, needle in ((tmp_path / "missing" / "r.png", "no such directory for --plot"),
                           (tmp_path, "is a directory")):
        start = time.perf_counter()
        proc = run_cli("report", "--eta", "3", "--plot", str(target), "--bundle",
                       str(tiny_model_dir), "--tokens", "100000")
        assert_one_line_error(proc, code=1, contains=needle)
        assert time.perf_counter() - start < 20  # no report was computed (it takes minutes)
