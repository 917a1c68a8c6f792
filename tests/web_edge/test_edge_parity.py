"""The two edges behave alike on what issue 34 (finding 7) found apart: the real `edge-agent`
and the real `privbert-edge` on the same files refuse a ledger others can write and warn about
one they can read in the same words, charge the target of a symlinked --ledger (which stays a
link), and create -o files 0600. (The server's 403 budget-exhausted: exit 3 in both,
tests/cloud_api/test_budget_attacks.py.)"""

from __future__ import annotations

import json
import stat

import pytest

from tests.web_edge.conftest import js_edge, py_edge


def both(args_of, tmp_path):
    """(edge-agent, privbert-edge) runs of ``args_of(ledger file)``, each on its own ledger."""
    py = py_edge(*args_of(tmp_path / "py.sqlite3"), tmp=tmp_path)
    js = js_edge(*args_of(tmp_path / "js.json"), tmp=tmp_path)
    return py, js


@pytest.mark.parametrize("mode, code", [(0o666, 1), (0o660, 1), (0o644, 0), (0o640, 0)])
def test_ledger_file_modes_get_the_same_refusal_or_warning(tmp_path, mode, code):
    made = both(lambda led: ["budget", "--ledger", str(led), "--cap", "100"], tmp_path)
    assert [p.returncode for p in made] == [0, 0], [p.stderr for p in made]
    for name in ("py.sqlite3", "js.json"):
        (tmp_path / name).chmod(mode)
    py, js = both(lambda led: ["budget", "--ledger", str(led)], tmp_path)
    assert (py.returncode, js.returncode) == (code, code), (py.stderr, js.stderr)
    word = "error" if code else "warning"
    expect = (f"the privacy ledger is writable by others (mode {mode:o}): another user could "
              "reset its spend or cap" if code else
              f"the privacy ledger is readable by others (mode {mode:o}): they can see what "
              "this device sent and when")
    for p, prog, led in ((py, "edge-agent", "py.sqlite3"), (js, "privbert-edge", "js.json")):
        path = tmp_path / led
        assert p.stderr == f"{prog}: {word}: {path}: {expect}; chmod 600 {path}\n", p.stderr


def test_a_symlinked_ledger_charges_its_target_in_both(tiny_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("the movie was good\na bad plot\n")
    for prog, name in ((py_edge, "py.sqlite3"), (js_edge, "js.json")):
        target, link = tmp_path / name, tmp_path / f"link-{name}"
        link.symlink_to(target)
        extra = ["--no-progress"] if prog is py_edge else []
        run = prog("privatize", str(src), "--eta", "5", "--bundle", str(tiny_dir),
                   "--ledger", str(link), *extra, tmp=tmp_path)
        assert run.returncode == 0, run.stderr
        assert link.is_symlink() and target.is_file()
        shown = prog("budget", "--ledger", str(target), "--json", tmp=tmp_path) \
            if prog is py_edge else prog("budget", "--ledger", str(target), tmp=tmp_path)
        st = json.loads(shown.stdout)
        assert (st["sends"], st["ledger"]) == (2, str(target)), st
        assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_output_files_are_0600_in_both(tiny_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("the movie was good\n")
    for prog, name in ((py_edge, "py"), (js_edge, "js")):
        out = tmp_path / f"{name}.jsonl"
        run = prog("privatize", str(src), "--eta", "5", "--bundle", str(tiny_dir), "-o",
                   str(out), tmp=tmp_path)
        assert run.returncode == 0, run.stderr
        assert stat.S_IMODE(out.stat().st_mode) == 0o600, (name, oct(out.stat().st_mode))
