"""The device's privacy ledger against a hostile user of the real `edge-agent` CLI (the
server side is tests/cloud_api/test_budget_attacks.py):

* memo variants: 12 spellings of one line that tokenize alike get the stored payload at no
  cost, with a token and a vector mechanism; the ledger holds no raw text;
* clock moves: with a per-day cap, the window follows the ledger's time (the latest time
  seen plus what the boot clock saw pass), not the wall clock: a clock set back counts in
  the latest window, one set forward opens no fresh window and refuses nothing that fits,
  and a clock stepped +299 s before each of 2,000 charges passes no more than the cap
  (time-machine moves the wall clock of its process only, never the boot clock);
* file modes: a new ledger is 0600, one others can write is refused with the chmod fix,
  one others can read is warned about, a symlink reaches the same memo key, a key path that
  is a directory is named as such, a read-only ledger is shown, huge caps print short;
* a ledger written before this version (schema 1) opens, migrates, and its memo holds.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest

from edge_agent.budget.ledger import VERSION
from edge_agent.budget.memo import key_path, load_secret
from tests.conftest import distinct_lines
from tests.edge_agent.conftest import REPO, assert_one_line_error, run_cli

BASE = "The café is good"
VARIANTS = [BASE, BASE + " ", " " + BASE, "The  café is  good",
            unicodedata.normalize("NFD", BASE), BASE.upper(), BASE.title(),
            "The ca\u200bfé is good", "The\u00a0café is good", "The ca\u00adfé is good",
            "\ufeff" + BASE, "The\tcafé is good"]


def status(ledger: Path) -> dict:
    p = run_cli("budget", "--json", "--ledger", str(ledger))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def privatize(src: Path, ledger: Path, *args: str, env: dict | None = None):
    return run_cli("privatize", str(src), "--ledger", str(ledger), *args, env=env)


@pytest.mark.parametrize("mech", [["--eta", "65"], ["--mechanism", "laplace",
                                                    "--epsilon", "2"]],
                         ids=["dchi-text", "laplace"])
def test_twelve_spellings_of_one_line_cost_one_payload(mech, minilm_enc_dir, tmp_path):
    """One line, then its 12 variants (spaces, NFD, case, zero-width, no-break and soft
    hyphen characters, a BOM, a tab): the variants cost nothing and are sent as the payload
    stored for the first; neither the ledger nor its WAL holds the text."""
    led = tmp_path / "ledger.sqlite3"
    one, many = tmp_path / "one.txt", tmp_path / "many.txt"
    one.write_text(BASE + "\n")
    many.write_text("".join(v + "\n" for v in VARIANTS))
    args = [*mech, "--bundle", str(minilm_enc_dir)]
    first = privatize(one, led, *args)
    assert first.returncode == 0, first.stderr
    spent = status(led)
    again = privatize(many, led, *args)
    assert again.returncode == 0, again.stderr
    after = status(led)
    print(f"\n{mech[1] if mech[0] == '--mechanism' else 'dchi-text'}: 12 variants after the "
          f"line: {after['sends'] - spent['sends']} extra charges")
    assert (after["sends"], after["spent"]) == (spent["sends"], spent["spent"]) == (
        1, spent["spent"]), after
    payloads = {json.dumps(json.loads(ln)["payload"], sort_keys=True)
                for ln in (first.stdout + again.stdout).splitlines()}
    assert len(payloads) == 1
    for f in tmp_path.glob("ledger.sqlite3*"):
        data = f.read_bytes().lower()
        assert b"caf" not in data and b"is good" not in data, f


TIME_MACHINE = ("import sys, time, time_machine\n"
                "time_machine.travel(time.time() + float(sys.argv[1]), tick=True).start()\n"
                "from edge_agent.cli import main\n"
                "sys.exit(main(sys.argv[2:]))\n")


def at_offset(offset_s: float, *args: str) -> subprocess.CompletedProcess:
    """The real CLI with its wall clock moved by ``offset_s`` (the boot clock is not)."""
    pytest.importorskip("time_machine")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", TIME_MACHINE, str(offset_s), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def dry_cost(src: Path, *common: str) -> float:
    dry = run_cli("privatize", str(src), *common, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    return float(dry.stdout.split("cost worst-case epsilon ")[1].split()[0].replace(",", ""))


def test_the_per_day_cap_holds_when_the_clock_moves(tiny_enc_dir, tmp_path):
    """A per-day cap of 1.5 runs: one run now; with the clock 2 days back a second run
    counts in the latest window (refused, exit 3); with the clock 2 days ahead a third is
    refused the same way (no fresh window: only seconds passed on the boot clock), while a
    small run that fits is not refused (an honest correction does not block the device);
    the last 24 hours never hold more than the cap."""
    led = tmp_path / "ledger.sqlite3"
    lines = distinct_lines(63)
    srcs = []
    for n, (a, b) in enumerate([(0, 20), (20, 40), (40, 60), (60, 63)]):
        srcs.append(tmp_path / f"in{n}.txt")
        srcs[-1].write_text("".join(t + "\n" for t in lines[a:b]))
    common = ["--eta", "5", "--bundle", str(tiny_enc_dir), "--ledger", str(led)]
    cost, small = dry_cost(srcs[0], *common), dry_cost(srcs[3], *common)
    assert small < 0.5 * cost
    assert run_cli("budget", "--ledger", str(led), "--per-day", repr(1.5 * cost)
                   ).returncode == 0
    assert run_cli("privatize", str(srcs[0]), *common, "-o", str(tmp_path / "o0")
                   ).returncode == 0
    back = at_offset(-2 * 86_400, "privatize", str(srcs[1]), *common, "-o",
                     str(tmp_path / "o1"))
    assert_one_line_error(back, 3, "in the last 24 hours")
    ahead = at_offset(2 * 86_400, "privatize", str(srcs[2]), *common, "-o",
                      str(tmp_path / "o2"))
    assert_one_line_error(ahead, 3, "in the last 24 hours")
    fits = at_offset(2 * 86_400, "privatize", str(srcs[3]), *common, "-o",
                     str(tmp_path / "o3"))
    assert fits.returncode == 0, fits.stderr
    st = status(led)
    print(f"\nclock moved back and forth: spent in the last 24 h {st['per_day']['spent_last_24h']:.6g}"
          f" = {st['per_day']['spent_last_24h'] / (1.5 * cost):.3f} of the per-day cap")
    assert st["per_day"]["spent_last_24h"] <= 1.5 * cost
    assert st["spent"] == pytest.approx(cost + small, rel=1e-4)  # the dry run prints 5 digits


STEP_S, CHARGES, PER_DAY, EPS = 299.0, 2_000, 100_000.0, 220.2  # issue 34's attack


def test_a_clock_stepped_before_every_charge_passes_no_more_than_the_per_day_cap(tmp_path):
    """Issue 34: the process's wall clock stepped +299 s before each of 2,000 charges of
    220.2 (440,400 in all) against a per-day cap of 100,000 passed 4.4 times the cap in
    seconds. The window now runs on the boot clock: what passes is at most the cap (and a
    cap's worth does pass: the device is not blocked)."""
    time_machine = pytest.importorskip("time_machine")
    from edge_agent.budget.ledger import DeviceLedger
    from edge_agent.errors import BudgetRefused
    from shared.ledger import Cost

    cost = Cost("dchi", EPS, metric=65.0, tokens=1)
    admitted = 0
    with DeviceLedger.open(tmp_path / "ledger.sqlite3") as led:
        led.set_cap("per_day", PER_DAY)
        with time_machine.travel(time.time(), tick=True) as traveller:
            for _ in range(CHARGES):
                traveller.shift(STEP_S)
                try:
                    led.charge([cost], [b"{}"], [None], mechanism="dchi-text",
                               params={"eta": 65.0}, bundle_id="b" * 64)
                    admitted += 1
                except BudgetRefused:
                    pass
        spent = led.status().spent
    print(f"\nwall clock +{STEP_S:.0f} s before each of {CHARGES:,} charges of {EPS}: passed "
          f"{spent:,.1f} = {spent / PER_DAY:.3f} x the per-day cap of {PER_DAY:,.0f}")
    assert spent <= PER_DAY
    assert admitted == int(PER_DAY // EPS)


def test_a_ledger_of_version_2_keeps_its_boot_anchor(tmp_path):
    """A version-2 ledger (one anchor: the boot of its last charge) migrates to the current version
    with that anchor, so its window keeps running on the boot clock: a charge made 10 s ago
    (by the boot clock) with the wall clock now 2 days ahead is still in the window."""
    from edge_agent.budget.clock import system_clock
    from edge_agent.budget.ledger import VERSION, DeviceLedger

    reading = system_clock().read()
    if not reading.since_boot:
        pytest.skip("no boot clock here (Linux only)")
    led = tmp_path / "ledger.sqlite3"
    db = sqlite3.connect(led)
    db.executescript(OLD_SCHEMA + """
        CREATE TABLE clock (id INTEGER PRIMARY KEY CHECK (id = 1), latest REAL NOT NULL,
            boot_id TEXT, boot_at REAL);
        PRAGMA user_version = 2;""")
    then = time.time() - 2 * 86_400  # the wall clock of the last charge
    db.execute("INSERT INTO settings VALUES ('per_day', 10.0)")
    db.execute("INSERT INTO spend VALUES ('dchi', 7.0, 1.0, 4, 1)")
    db.execute("INSERT INTO charges (at, family, mechanism, params, bundle_id, epsilon, metric,"
               " tokens, sends) VALUES (?, 'dchi', 'dchi-text', '{}', 'x', 7.0, 1, 4, 1)",
               (then,))
    db.execute("INSERT INTO clock VALUES (1, ?, ?, ?)", (then, reading.epoch, reading.at - 10))
    db.commit()
    db.close()
    led.chmod(0o600)
    with DeviceLedger.open(led) as ledger:
        st = ledger.status()
        assert ledger.version == VERSION >= 3
    assert st.day_spent == 7.0 and st.spent == 7.0


def test_ledger_files_are_private_and_found_through_symlinks(tiny_enc_dir, tmp_path):
    led = tmp_path / "ledger.sqlite3"
    src = tmp_path / "in.txt"
    src.write_text("the movie is good\n")
    args = ["--eta", "5", "--bundle", str(tiny_enc_dir)]
    assert privatize(src, led, *args).returncode == 0
    assert stat.S_IMODE(led.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_path(led).stat().st_mode) == 0o600
    link = tmp_path / "link.sqlite3"
    link.symlink_to(led)
    via = privatize(src, link, *args)
    assert via.returncode == 0, via.stderr
    assert not key_path(link).exists() and status(led)["sends"] == 1  # memoized, free
    led.chmod(0o666)
    bad = privatize(src, led, *args)
    assert_one_line_error(bad, 1, f"chmod 600 {led}")
    led.chmod(0o644)
    warned = privatize(src, led, *args)
    assert warned.returncode == 0 and "readable by others" in warned.stderr
    led.chmod(0o600)
    other = tmp_path / "other.sqlite3"
    key_path(other).mkdir(mode=0o755)
    assert_one_line_error(privatize(src, other, *args), 1, "is a directory")


def test_output_files_are_created_0600(tiny_enc_dir, tmp_path):
    """-o files hold what this device sent: created 0600 whatever the umask lets through,
    also an empty one (nothing but blank lines)."""
    src, blank = tmp_path / "in.txt", tmp_path / "blank.txt"
    src.write_text("the movie is good\n")
    blank.write_text("\n  \n")
    for name, inp in (("out.jsonl", src), ("empty.jsonl", blank)):
        out = tmp_path / name
        p = privatize(inp, tmp_path / "ledger.sqlite3", "--eta", "5", "--bundle",
                      str(tiny_enc_dir), "-o", str(out))
        assert p.returncode == 0, p.stderr
        assert stat.S_IMODE(out.stat().st_mode) == 0o600, (name, oct(out.stat().st_mode))
    assert (tmp_path / "empty.jsonl").read_bytes() == b""


def test_budget_reads_a_read_only_ledger_and_prints_huge_caps_short(tmp_path):
    led = tmp_path / "ledger.sqlite3"
    p = run_cli("budget", "--ledger", str(led), "--cap", "1e308")
    assert p.returncode == 0 and "cap: 1e+308" in p.stdout and "000000" not in p.stdout, p.stdout
    if subprocess.run(["chattr", "+i", str(led)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (an immutable file: EPERM on open)")
    try:
        p = run_cli("budget", "--ledger", str(led))
        assert p.returncode == 0 and "cap: 1e+308" in p.stdout, p.stderr
        assert_one_line_error(run_cli("budget", "--ledger", str(led), "--cap", "1"), 1,
                              "cannot open the privacy ledger")
    finally:
        subprocess.run(["chattr", "-i", str(led)], check=True)


OLD_SCHEMA = """
CREATE TABLE settings (name TEXT PRIMARY KEY, value REAL);
CREATE TABLE spend (family TEXT PRIMARY KEY, epsilon REAL, metric REAL NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0, sends INTEGER NOT NULL DEFAULT 0);
CREATE TABLE charges (id INTEGER PRIMARY KEY, at REAL NOT NULL, family TEXT NOT NULL,
    mechanism TEXT NOT NULL, params TEXT NOT NULL, bundle_id TEXT NOT NULL, epsilon REAL,
    metric REAL NOT NULL, tokens INTEGER NOT NULL, sends INTEGER NOT NULL);
CREATE INDEX charges_at ON charges (at);
CREATE TABLE memo (key BLOB PRIMARY KEY, payload BLOB NOT NULL) WITHOUT ROWID;
"""


def test_a_ledger_written_before_versions_opens_and_keeps_its_memo(tiny_enc_dir,
                                                                    tiny_enc_bundle, tmp_path):
    """A ledger of schema 1 (user_version 0, memo keyed on the raw text): its spend shows,
    it is migrated to version 2 at the next run, and a text it memoized is sent as stored,
    free; so is every other spelling of that text from then on."""
    from edge_agent.budget.memo import LegacyMemoKeys  # the raw-text keys of schema 1

    led = tmp_path / "ledger.sqlite3"
    src = tmp_path / "in.txt"
    src.write_text("the movie is good\n")
    args = ["--eta", "5", "--bundle", str(tiny_enc_dir)]
    fresh = privatize(src, tmp_path / "scratch.sqlite3", *args)  # a payload to store
    stored = json.dumps(json.loads(fresh.stdout)["payload"], separators=(",", ":")).encode()
    db = sqlite3.connect(led)
    db.executescript(OLD_SCHEMA)
    db.execute("INSERT INTO spend VALUES ('dchi', 2.5, 1.0, 4, 1)")
    db.execute("INSERT INTO charges (at, family, mechanism, params, bundle_id, epsilon, metric,"
               " tokens, sends) VALUES (1.7e9, 'dchi', 'dchi-text', '{}', 'x', 2.5, 1, 4, 1)")
    keys = LegacyMemoKeys(load_secret(key_path(led)), {
        "mechanism": "dchi-text", "params": {"eta": 5.0}, "bundle_id": tiny_enc_bundle.bundle_id,
        "float_dtype": "float32", "max_length": tiny_enc_bundle.max_length,
        "truncate": "first"})
    db.execute("INSERT INTO memo VALUES (?, ?)", (keys.key("the movie is good"), stored))
    db.commit()
    db.close()
    led.chmod(0o600)
    assert status(led)["spent"] == 2.5
    src.write_text("the movie is good\nThe  MOVIE is good\n")
    run = privatize(src, led, *args)
    assert run.returncode == 0, run.stderr
    sent = {json.dumps(json.loads(ln)["payload"], separators=(",", ":")).encode()
            for ln in run.stdout.splitlines()}
    assert sent == {stored}
    st = status(led)
    assert (st["spent"], st["sends"]) == (2.5, 1)
    with sqlite3.connect(led) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == VERSION
