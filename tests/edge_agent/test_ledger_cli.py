"""The device ledger through the real CLI: what `edge-agent privatize` charges, memoization,
caps refusing runs before anything is written or sent, a SIGKILL after the charge, two
processes racing to the cap, and `edge-agent budget`.

The charged figures are recomputed here from the payloads the CLI wrote
(``shared.ledger.payload_cost``), compared with a relative tolerance of 1e-9 (sums of a few
dozen floats)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_agent.cli import main
from edge_agent.privatize.privatizer import Privatizer
from shared import ledger
from shared.accounting import bundle_diameter
from shared.conventions import fmt_eps as fmt
from shared.payload import parse_record
from tests.conftest import distinct_lines
from tests.edge_agent.conftest import REPO, assert_one_line_error, run_cli
from tests.edge_agent.test_server_paths import serve_model

REL = 1e-9
LINES = ["the movie is good\t1", "bad plot , awful actor\t0", "a very fun story\t1",
         "not boring !\t0"]


@pytest.fixture
def tiny(tiny_enc_dir) -> list[str]:
    return ["--bundle", str(tiny_enc_dir)]


@pytest.fixture
def src(tmp_path) -> Path:
    p = tmp_path / "in.tsv"
    p.write_text("\n".join(LINES) + "\n")
    return p


def budget(capfd, *flags: str) -> dict:
    capfd.readouterr()
    assert main(["budget", "--json", *flags]) == 0
    return json.loads(capfd.readouterr().out)


def charged(records, bundle) -> float:
    """What the ledger should hold for these records: their payloads' costs."""
    d = bundle_diameter(bundle)
    return sum(ledger.payload_cost(r.payload, d).epsilon for r in records)


def read(path: Path) -> list:
    return [parse_record(x) for x in path.read_text().splitlines()]


def test_every_payload_is_charged_and_budget_reports_it(capfd, src, tmp_path, tiny,
                                                        tiny_enc_bundle):
    st = budget(capfd)
    assert (st["spent"], st["cap"], st["remaining"], st["sends"]) == (0.0, None, None, 0)
    out = tmp_path / "out.jsonl"
    assert main(["privatize", str(src), "--tsv", "--eta", "5", "-o", str(out), *tiny]) == 0
    recs = read(out)
    st = budget(capfd)
    assert st["spent"] == pytest.approx(charged(recs, tiny_enc_bundle), rel=REL)
    assert st["sends"] == 4 and st["families"]["dchi"]["tokens"] == sum(
        r.payload.n_tokens for r in recs)
    assert st["families"]["dchi"]["metric"] == pytest.approx(5.0 * st["families"]["dchi"]
                                                             ["tokens"], rel=REL)
    assert main(["privatize", str(src), "--tsv", "--mechanism", "texthide", "--m", "4",
                 "--texthide-key", "3b9f0e6c2a7d48e1b05c9f13a6d27e84", "-o", str(out),
                 *tiny]) == 0
    st2 = budget(capfd)
    assert st2["families"]["texthide"] == {"epsilon": None, "metric": 0.0, "tokens": 0,
                                           "sends": 4}
    assert st2["spent"] == st["spent"]  # no epsilon to add
    capfd.readouterr()
    assert main(["budget"]) == 0
    text = capfd.readouterr().out
    assert "cap: none (everything is counted" in text and "texthide" in text


def test_a_memoized_send_is_byte_identical_and_free(capfd, src, tmp_path, tiny,
                                                    tiny_enc_bundle):
    a, b, c = (tmp_path / n for n in ("a.jsonl", "b.jsonl", "c.jsonl"))
    flags = ["--tsv", "--mechanism", "dchi-embedding", "--eta", "5", *tiny]
    assert main(["privatize", str(src), *flags, "-o", str(a)]) == 0
    spent = budget(capfd)["spent"]
    assert main(["privatize", str(src), *flags, "-o", str(b)]) == 0
    assert "0 memoized" not in capfd.readouterr().err
    assert b.read_bytes() == a.read_bytes()
    assert budget(capfd)["spent"] == spent
    # fresh draws with --no-memo: other payloads (float noise), each one charged
    assert main(["privatize", str(src), *flags, "--no-memo", "-o", str(c)]) == 0
    assert c.read_bytes() != a.read_bytes()
    assert budget(capfd)["spent"] == pytest.approx(2 * spent, rel=REL)
    # other parameters are another setting: charged, not memoized
    assert main(["privatize", str(src), "--tsv", "--mechanism", "dchi-embedding", "--eta", "6",
                 *tiny, "-o", str(c)]) == 0
    assert budget(capfd)["spent"] == pytest.approx(2 * spent + charged(read(c),
                                                                        tiny_enc_bundle),
                                                    rel=REL)


def test_repeats_inside_one_input_are_memoized_too(capfd, tmp_path, tiny, tiny_enc_bundle):
    src = tmp_path / "rep.txt"
    src.write_text("good movie\nbad plot\ngood movie\ngood movie\n")
    out = tmp_path / "o.jsonl"
    assert main(["privatize", str(src), "--eta", "5", "-o", str(out), *tiny]) == 0
    lines = out.read_bytes().splitlines()
    assert lines[0] == lines[2] == lines[3] and lines[0] != lines[1]
    assert budget(capfd)["spent"] == pytest.approx(charged(read(out)[:2], tiny_enc_bundle),
                                                    rel=REL)


def test_dry_run_prints_the_cost_and_spends_nothing(capfd, src, tmp_path, tiny):
    assert main(["privatize", str(src), "--tsv", "--eta", "5", "--dry-run", *tiny]) == 0
    line = capfd.readouterr().out.strip()
    assert line.startswith("dry run: 4 record(s), 4 new payload(s)") and "fits" in line
    planned = float(line.split("cost worst-case epsilon ")[1].split()[0].replace(",", ""))
    assert budget(capfd)["spent"] == 0.0
    assert main(["privatize", str(src), "--tsv", "--eta", "5", "-o",
                 str(tmp_path / "o.jsonl"), *tiny]) == 0
    assert budget(capfd)["spent"] == pytest.approx(planned, rel=1e-3)  # printed to 4 digits
    assert main(["privatize", str(src), "--tsv", "--eta", "5", "--dry-run", *tiny]) == 0
    assert "0 new payload(s), 4 memoized (free); cost nothing" in capfd.readouterr().out


def test_a_cap_of_zero_refuses_everything(capfd, src, tmp_path, tiny):
    assert budget(capfd, "--cap", "0")["cap"] == 0.0
    out = tmp_path / "o.jsonl"
    for flags in (["--eta", "5"], ["--mechanism", "laplace", "--epsilon", "1"],
                  ["--mechanism", "texthide", "--m", "4", "--texthide-key",
                   "3b9f0e6c2a7d48e1b05c9f13a6d27e84"], ["--mechanism", "none",
                                                          "--allow-none"]):
        capfd.readouterr()
        assert main(["privatize", str(src), "--tsv", *flags, "-o", str(out), *tiny]) == 3
        err = [x for x in capfd.readouterr().err.splitlines() if "warning" not in x]
        assert len(err) == 1 and err[0].startswith("edge-agent: error:")
        assert not out.exists()
    assert budget(capfd)["spent"] == 0.0 and budget(capfd)["sends"] == 0


def test_a_run_past_the_cap_exits_3_before_anything_is_written_or_posted(
        capfd, fake_server, src, tmp_path, tiny, tiny_enc_bundle):
    serve_model(fake_server, tiny_enc_bundle)
    out = tmp_path / "o.jsonl"
    assert main(["privatize", str(src), "--tsv", "--eta", "5", "--dry-run", *tiny]) == 0
    line = capfd.readouterr().out
    need = float(line.split("cost worst-case epsilon ")[1].split()[0].replace(",", ""))
    budget(capfd, "--cap", str(need * 0.9))
    proc = run_cli("privatize", str(src), "--tsv", "--eta", "5", "-o", str(out), "--server",
                   fake_server.url, "--post", "records", "--task", "t", *tiny)
    err = assert_one_line_error(proc, 3, "privacy budget: spent 0")
    assert "needs" in err and f"cap {fmt(need * 0.9)}" in err
    assert "nothing was written or sent" in err
    assert not out.exists()
    assert not [r for r in fake_server.requests if r["method"] == "POST"]
    assert budget(capfd)["spent"] == 0.0


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "-1", "1e999", "lots"])
def test_nan_negative_or_infinite_caps_are_refused(capfd, bad):
    budget(capfd, "--cap", "100", "--per-day", "10")
    capfd.readouterr()
    for flag in ("--cap", "--per-day"):
        assert main(["budget", f"{flag}={bad}"]) == 2
        assert "must be a finite number >= 0" in capfd.readouterr().err or bad == "lots"
    st = budget(capfd)
    assert st["cap"] == 100.0 and st["per_day"]["cap"] == 10.0


def test_per_day_cap_says_it_is_not_a_lifetime_bound(capfd, src, tmp_path, tiny):
    st = budget(capfd, "--per-day", "1")
    assert st["per_day"]["note"] == "a daily cap is not a lifetime bound" and st["cap"] is None
    capfd.readouterr()
    assert main(["budget"]) == 0
    assert "a daily cap is not a lifetime bound" in capfd.readouterr().out
    assert main(["privatize", str(src), "--tsv", "--eta", "5", "-o", str(tmp_path / "o"),
                 *tiny]) == 3
    assert "per-day cap 1" in capfd.readouterr().err
    budget(capfd, "--per-day", "none")
    assert main(["privatize", str(src), "--tsv", "--eta", "5", "-o", str(tmp_path / "o"),
                 *tiny]) == 0


def test_the_memo_key_is_private_to_its_owner(capfd, src, tmp_path, tiny):
    path = Path(os.environ["PRIVBERT_LEDGER"])
    assert main(["privatize", str(src), "--tsv", "--eta", "5", "-o", str(tmp_path / "o"),
                 *tiny]) == 0
    key = path.with_name(path.name + ".key")
    for p in (path, key):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    os.chmod(key, 0o644)
    capfd.readouterr()
    assert main(["privatize", str(src), "--tsv", "--eta", "5", "-o", str(tmp_path / "o"),
                 *tiny]) == 1
    assert "readable by others" in capfd.readouterr().err


def spent_now(path: Path) -> float:
    if not path.exists():
        return 0.0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as db:
        try:
            return db.execute("SELECT COALESCE(SUM(epsilon), 0) FROM spend").fetchone()[0]
        except sqlite3.OperationalError:  # not created yet
            return 0.0


def test_sigkill_between_charge_and_send_leaves_the_charge(capfd, tmp_path, tiny_enc_dir,
                                                           tiny_enc_bundle):
    """The output is a FIFO nobody reads: the CLI charges the first batch, then blocks
    opening its output. Killed there, the ledger keeps the charge (over-counts, never
    under-counts) and nothing was written."""
    path = Path(os.environ["PRIVBERT_LEDGER"])
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{t}\n" for t in distinct_lines(40)))
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "edge_agent", "privatize", str(src),
                             "--eta", "5", "--bundle", str(tiny_enc_dir), "-o", str(fifo)],
                            cwd=REPO, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while spent_now(path) == 0.0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # still blocked on the FIFO: the next batch waits for the first's write
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert os.read(fd, 1 << 16) == b""  # nothing was ever written
    finally:
        os.close(fd)
    st = budget(capfd)
    assert st["sends"] == 16  # the first batch (16 lines), charged before its write
    items = Privatizer(tiny_enc_bundle, "none").tokenize(src.read_text().splitlines()[:16])
    tokens = sum(it.n_tokens for it in items)
    assert st["families"]["dchi"]["tokens"] == tokens
    assert st["spent"] == pytest.approx(5.0 * tokens * bundle_diameter(tiny_enc_bundle),
                                        rel=REL)


def test_two_processes_racing_to_the_cap_never_pass_it(capfd, tmp_path, tiny_enc_dir,
                                                       tiny_enc_bundle):
    """Two real runs on one ledger, each alone within the cap, together past it: the cap
    holds, at least one is refused (exit 3), and what was charged is what they wrote."""
    outs, procs = [], []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for n in range(2):
        src = tmp_path / f"in{n}.txt"
        src.write_text("".join(f"good movie {t}\n" for t in distinct_lines(240)[n * 120:][:120]))
        outs.append(tmp_path / f"out{n}.jsonl")
        if n == 0:  # the cost of one run, to set the cap at 1.5 runs
            assert main(["privatize", str(src), "--eta", "5", "--dry-run", "--bundle",
                         str(tiny_enc_dir)]) == 0
            line = capfd.readouterr().out
            one = float(line.split("cost worst-case epsilon ")[1].split()[0].replace(",", ""))
            cap = 1.5 * one
            budget(capfd, "--cap", repr(cap))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "edge_agent", "privatize", str(src), "--eta", "5",
             "--batch-size", "16", "--bundle", str(tiny_enc_dir), "-o", str(outs[-1])],
            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True))
    codes = [p.wait(180) for p in procs]
    errs = [p.stderr.read() for p in procs]
    assert sorted(codes) in ([0, 3], [3, 3]), (codes, errs)
    assert all("privacy budget" in e for c, e in zip(codes, errs, strict=True) if c == 3)
    st = budget(capfd)
    assert st["spent"] <= cap
    written = [r for o in outs if o.exists() for r in read(o)]
    assert st["sends"] == len(written)
    assert st["spent"] == pytest.approx(charged(written, tiny_enc_bundle), rel=REL)
