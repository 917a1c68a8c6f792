"""Edge agent end to end: `edge-agent privatize` on SST-2 training sentences per mechanism,
against the raw mechanism on the same tokens in the same run; the privacy report; cold start.

    python -m bench.edge [--sentences 10000] [--eta 65] [--skip-vector]

* privatize: one subprocess per mechanism (`python -m edge_agent privatize FILE --tsv ...
  -o OUT`), wall clock from spawn to exit, peak RSS of that child (VmHWM polled from
  /proc). "streaming" is the CLI's own tokens/s over its read-privatize-write loop (its
  summary line), i.e. without interpreter start, imports and bundle load; "tokens/CPU s"
  the same loop per CPU second of the process (all threads), which a machine whose
  cores go to other jobs disturbs far less than wall time.
* raw: `DChiText.privatize_ids` / `DChiEmbedding.privatize` alone, one call on all the
  tokens of the same sentences, in a fresh process (`python -m bench.edge --raw`), alternating
  with the CLI runs (--repeats, best of each) since other processes share the cores.
* laplace / ome / texthide need `encoder.onnx`: the MiniLM bundle with its encoder is
  exported here with `models.export.writers.export_bundle` (torch, in this bench process only).
* report: `edge-agent report` with 500 tokens x 1,000 perturbations at one eta (runtime),
  and `--target-inversion` (accuracy reached on the fixed draw).
* cold start: spawn to the first JSONL line on stdout with the default MiniLM bundle
  (median of 3), and the CLI's own "first record at" (from its start, after imports).
* ledger overhead (target <= 5%: the privacy budget ledger should not slow the edge): `edge-agent privatize` dchi-text on the same sentences
  with its privacy budget ledger (a fresh ledger file: every text charged and memoized; the
  same file again: every text memoized; a fresh file with a cap: the input costed first),
  against the same CLI with the ledger's calls taken out (``RunBudget`` replaced by a
  stand-in in that child process only: the product has no way to turn the ledger off),
  alternating, best of --ledger-repeats, in wall time and in CPU seconds of the child (the
  figure the other jobs on shared cores disturb least). ``--ledger-only`` runs just these
  rows. The ledger's own calls are also timed alone in one process (CPU seconds of charging
  every batch of the same run, against a fresh ledger and against one holding every text),
  a figure that the noise of whole-run comparisons does not swamp.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import DATA, REPO, machine, module_cmd, read_tsv, table

CLI = [sys.executable, "-m", "edge_agent"]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def peak_rss_mib(pid: int) -> float | None:
    """VmHWM of a running process (its own peak: ru_maxrss of a child would include the
    parent's memory at fork time)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


def run_child(argv: list[str], cmd: list[str] = CLI) -> dict:
    """Run a command; wall seconds, CPU seconds (user + system of the child and what it
    waited for, all threads), peak RSS (MiB, polled every 20 ms), stdout, stderr."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out_path = Path(tempfile.mkstemp(suffix=".out")[1])
    err_path = Path(tempfile.mkstemp(suffix=".err")[1])
    peak = 0.0
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd + argv, stdout=out, stderr=err, env=ENV, cwd=REPO)
        while proc.poll() is None:
            peak = max(peak, peak_rss_mib(proc.pid) or 0.0)
            time.sleep(0.02)
    wall = time.perf_counter() - t
    ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru2.ru_utime - ru.ru_utime) + (ru2.ru_stime - ru.ru_stime)
    stdout, stderr = out_path.read_text(), err_path.read_text()
    out_path.unlink()
    err_path.unlink()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{stderr}")
    return {"wall": wall, "cpu": cpu, "rss_mib": peak, "stdout": stdout, "stderr": stderr}


def raw_rate(mech: str, tsv: Path, eta: float) -> tuple[float, float]:
    """(tokens/s, tokens per CPU second) of the shared mechanism alone, one call on all
    tokens, in a fresh process."""
    r = run_child(["--raw", mech, str(tsv), "--eta", str(eta)],
                  cmd=module_cmd("bench.edge"))
    wall, cpu = r["stdout"].split()
    return float(wall), float(cpu)


def raw_main(mech: str, tsv: Path, eta: float) -> None:
    """Child of :func:`raw_rate`: print the raw tokens/s (best of 3 for dchi-embedding)."""
    from edge_agent.privatize.privatizer import Privatizer
    from shared.bundle import EdgeBundle
    from shared.mechanisms import DChiEmbedding, DChiText

    bundle = EdgeBundle.from_model()
    rows = read_tsv(tsv)
    items = Privatizer(bundle, "none").tokenize([r[0] for r in rows], allow_empty=True)
    ids = np.concatenate([it.ids_a for it in items if it is not None])
    if mech == "dchi-text":
        m = DChiText(bundle, eta)
        t, c = time.perf_counter(), time.process_time()
        m.privatize_ids(ids)
        best, best_cpu = time.perf_counter() - t, time.process_time() - c
    else:
        m, best, best_cpu = DChiEmbedding(eta), math.inf, math.inf
        for _ in range(3):
            t, c = time.perf_counter(), time.process_time()
            m.privatize(bundle.embeddings[ids])
            best = min(best, time.perf_counter() - t)
            best_cpu = min(best_cpu, time.process_time() - c)
    print(ids.size / best, ids.size / best_cpu)


def ledger_calls_main(tsv: Path, eta: float, work: Path) -> None:
    """Child of :func:`ledger_calls`: the ledger's own calls in one process, in CPU
    seconds (JSON on stdout). Every batch is read, tokenized and privatized as the CLI
    does; then timed: its payload JSON and output lines (``token_rows``, ``lines()``: the
    CLI's work after the mechanism, with or without the ledger), and, on their own, the
    ledger's calls: opening it and charging every batch (``RunBudget.charge_rows``: costs,
    memo keys, the SQLite transaction) against a fresh ledger, then the same batches
    against that ledger (every text memoized); and the pass a run with a cap makes first
    (``RunBudget.plan``: the input read, tokenized and costed once more)."""
    from dataclasses import replace

    from edge_agent.privatize.batches import privatized, tokenized
    from edge_agent.privatize.charging import RunBudget
    from edge_agent.privatize.lines import LineReader
    from edge_agent.privatize.options import LedgerOptions, MechanismOptions, PrivatizeOptions
    from edge_agent.privatize.run_setup import make_privatizer
    from shared.bundle import EdgeBundle

    led = work / f"calls-{os.getpid()}.sqlite3"
    opts = PrivatizeOptions(str(tsv), mechanism=MechanismOptions(values={"eta": eta}),
                            ledger=LedgerOptions(path=str(led)))
    bundle = EdgeBundle.from_model()
    _, priv = make_privatizer(opts, bundle, None)
    with open(tsv, "rb") as f:
        reader = LineReader(f, tsv=True)
        ready = [privatized(opts, priv, tokenized(opts, priv, reader, b), None)
                 for b in reader.batches(opts.input.batch_size)]
    ready = [r for r in ready if r.items]
    labels = [[ln.label for ln in r.lines] for r in ready]
    cpu: dict[str, float] = {}
    c = time.process_time()
    rows = [priv.token_rows(r.items, r.data, lab) for r, lab in zip(ready, labels, strict=True)]
    for rw in rows:
        rw.lines()
    cpu["payload JSON + lines (no ledger)"] = time.process_time() - c
    for what in ("new texts", "every text memoized"):
        c = time.process_time()
        budget = RunBudget(opts, priv, bundle)
        for r, rw in zip(ready, rows, strict=True):
            budget.charge_rows(r.lines, r.items, rw)
        budget.close()
        cpu[f"ledger: open + charge every batch, {what}"] = time.process_time() - c
    c = time.process_time()  # a run with a cap first reads, tokenizes and costs its input
    budget = RunBudget(replace(opts, ledger=LedgerOptions(path=str(led) + "-plan")), priv,
                       bundle)  # a fresh ledger: every text new
    with open(tsv, "rb") as f:
        first = LineReader(f, tsv=True)
        budget.plan(tokenized(opts, priv, first, b)
                    for b in first.batches(opts.input.batch_size))
    budget.close()
    cpu["ledger with a cap: costing the input first (read, tokenize, memo keys)"] = \
        time.process_time() - c
    print(json.dumps(cpu))


def ledger_calls(tsv: Path, eta: float, work: Path) -> dict[str, float]:
    """CPU seconds of the ledger's own calls (:func:`ledger_calls_main`, a fresh process)."""
    r = run_child(["--ledger-calls", str(tsv), str(work), "--eta", str(eta)],
                  cmd=module_cmd("bench.edge"))
    return json.loads(r["stdout"])


_CHILD = """
import sys
{patch}
from edge_agent.cli import main
sys.exit(main(sys.argv[1:]))
"""
_NO_LEDGER = """
import edge_agent.privatize.run as run
class NoLedger:  # the baseline only: the same run with the ledger's calls taken out
    capped = False
    def __init__(self, opts, priv, bundle):
        pass
    def charge(self, lines, payloads, jsons):
        return jsons
    def charge_rows(self, lines, rows):
        return rows.jsons
    def summary(self):
        return "no ledger"
    def close(self):
        pass
run.RunBudget = NoLedger
"""


def ledger_rows(tsv: Path, eta: float, out: str, repeats: int, work: Path) -> list[list]:
    """Rows of the ledger overhead table (see the module docstring)."""
    variants = {
        "no ledger (baseline)": (_NO_LEDGER, None, False),
        "ledger, new texts (charged, memoized)": ("", "fresh", False),
        "ledger, every text memoized (2nd run)": ("", "same", False),
        "ledger with a cap (input costed first)": ("", "fresh", True),
    }
    walls: dict[str, list[float]] = {k: [] for k in variants}
    cpus: dict[str, list[float]] = {k: [] for k in variants}
    stream: dict[str, list[float]] = {k: [] for k in variants}
    size: dict[str, int] = {}
    for rep in range(repeats):
        same = work / f"same-{rep}.sqlite3"
        for name, (patch, which, cap) in variants.items():
            argv = ["privatize", str(tsv), "--tsv", "--eta", str(eta), "-o", out]
            led = None
            if which == "fresh":
                led = work / f"fresh-{rep}-{len(walls[name])}-{cap}.sqlite3"
            elif which == "same":
                led = same
                if not same.exists():  # its first run, not timed: charges every text
                    run_child([*argv, "--ledger", str(same)],
                              cmd=[sys.executable, "-c", _CHILD.format(patch="")])
            if led is not None:
                argv += ["--ledger", str(led)]
                if cap:
                    run_child(["budget", "--cap", "1e300", "--ledger", str(led)])
            r = run_child(argv, cmd=[sys.executable, "-c", _CHILD.format(patch=patch)])
            walls[name].append(r["wall"])
            cpus[name].append(r["cpu"])
            stream[name].append(streaming_rate(r["stderr"]))
            if led is not None:
                size[name] = led.stat().st_size
            print(f"  {name}: {r['wall']:.1f} s, CPU {r['cpu']:.1f} s", file=sys.stderr)
    base = min(walls["no ledger (baseline)"])
    base_cpu = min(cpus["no ledger (baseline)"])
    med_cpu = statistics.median(cpus["no ledger (baseline)"])
    rows = []
    for name in variants:
        best, best_cpu = min(walls[name]), min(cpus[name])
        first = name.startswith("no ledger")
        rows.append([name, f"{best:.2f} s", f"{best_cpu:.2f} s", f"{max(stream[name]):,.0f}",
                     "—" if first else f"{best / base - 1:+.1%}",
                     "—" if first else f"{best_cpu / base_cpu - 1:+.1%}",
                     "—" if first else f"{statistics.median(cpus[name]) / med_cpu - 1:+.1%}",
                     f"{size[name] / 2**20:.1f} MiB" if name in size else "—",
                     " ".join(f"{w:.1f}" for w in walls[name]),
                     " ".join(f"{c:.1f}" for c in cpus[name])])
    return rows


def streaming_rate(stderr: str) -> float:
    m = re.search(r"([\d,]+) tokens/s streaming", stderr)
    return float(m.group(1).replace(",", "")) if m else float("nan")


def cpu_rate(stderr: str) -> float:
    m = re.search(r"([\d,]+) tokens per CPU second", stderr)
    return float(m.group(1).replace(",", "")) if m else float("nan")


def first_record_at(stderr: str) -> float:
    m = re.search(r"first record at ([\d.]+) s", stderr)
    return float(m.group(1)) if m else float("nan")


def cold_start(tsv: Path, eta: float, repeats: int = 3) -> tuple[float, float]:
    """(median spawn -> first stdout line, median in-CLI first record) in seconds."""
    spawn, inside = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        proc = subprocess.Popen(CLI + ["privatize", str(tsv), "--tsv", "--eta", str(eta)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                                cwd=REPO)
        proc.stdout.readline()
        spawn.append(time.perf_counter() - t)
        proc.stdout.read()
        err = proc.stderr.read().decode()
        proc.wait()
        inside.append(first_record_at(err))
    return statistics.median(spawn), statistics.median(inside)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=10_000)
    ap.add_argument("--eta", type=float, default=65.0)
    ap.add_argument("--skip-vector", action="store_true", help="no laplace/ome/texthide")
    ap.add_argument("--skip-report", action="store_true", help="no edge-agent report runs")
    ap.add_argument("--skip-cold", action="store_true", help="no cold-start runs")
    ap.add_argument("--only", nargs="+", metavar="MECH", help="run only these dχ rows "
                    "(dchi-text dchi-embedding dchi-embedding-float16)")
    ap.add_argument("--report-tokens", type=int, default=500)
    ap.add_argument("--report-samples", type=int, default=1000)
    ap.add_argument("--target", type=float, default=0.5, help="target inversion accuracy")
    ap.add_argument("--repeats", type=int, default=2, help="alternating raw/CLI runs (dχ)")
    ap.add_argument("--ledger-repeats", type=int, default=3,
                    help="alternating runs of each ledger variant (best of them)")
    ap.add_argument("--ledger-only", action="store_true", help="only the ledger overhead rows")
    ap.add_argument("--raw", nargs=2, metavar=("MECH", "TSV"), help=argparse.SUPPRESS)
    ap.add_argument("--ledger-calls", nargs=2, metavar=("TSV", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.raw:
        raw_main(args.raw[0], Path(args.raw[1]), args.eta)
        return
    if args.ledger_calls:
        ledger_calls_main(Path(args.ledger_calls[0]), args.eta, Path(args.ledger_calls[1]))
        return

    from edge_agent.privatize.privatizer import Privatizer
    from shared.bundle import EdgeBundle

    tmp = Path(tempfile.mkdtemp(prefix="bench-edge-"))
    rows = read_tsv(DATA / "sst2" / "train.tsv", args.sentences)
    tsv = tmp / "train.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(f"{r[0]}\t{r[1]}\n" for r in rows))
    small = tmp / "small.tsv"
    small.write_text("sentence\tlabel\n" + "".join(f"{r[0]}\t{r[1]}\n" for r in rows[:300]))
    bundle = EdgeBundle.from_model()
    items = Privatizer(bundle, "none").tokenize([r[0] for r in rows], allow_empty=True)
    n_rec = sum(it is not None for it in items)
    n_tok = sum(it.n_tokens for it in items if it is not None)
    eta = args.eta
    out = str(tmp / "out.jsonl")
    ENV["PRIVBERT_LEDGER"] = str(tmp / "ledger.sqlite3")  # never the user's own ledger
    if args.ledger_only:
        load_before = os.getloadavg()
        rows = ledger_rows(tsv, args.eta, out, args.ledger_repeats, tmp)
        calls = ledger_calls(tsv, args.eta, tmp)
        print_ledger(rows, calls, n_rec, n_tok, args, load_before)
        return
    results = []
    raw_text_rates = []
    load_before = os.getloadavg()
    print(f"{n_rec} sentences, {n_tok} tokens", file=sys.stderr)

    def e2e(name: str, flags: list[str], raw_mech: str | None = None) -> None:
        """CLI and raw alternately, ``repeats`` times each (dχ only); best of each."""
        runs, raws, raw_cpus = [], [], []
        for _ in range(args.repeats if raw_mech else 1):
            if raw_mech:
                w, c = raw_rate(raw_mech, tsv, eta)
                raws.append(w)
                raw_cpus.append(c)
            fresh = tmp / f"ledger-{len(results)}-{len(runs)}.sqlite3"  # no memoized texts
            runs.append(run_child(["privatize", str(tsv), "--tsv", *flags, "-o", out,
                                   "--ledger", str(fresh)]))
            print(f"  {name}: {runs[-1]['wall']:.1f} s" + (f", raw {raws[-1]:,.0f} tokens/s"
                                                         if raws else ""), file=sys.stderr)
        r = min(runs, key=lambda x: x["wall"])
        raw = max(raws) if raws else None
        raw_cpu = max(raw_cpus) if raw_cpus else None
        cli_cpu = max(cpu_rate(x["stderr"]) for x in runs)
        if raw_mech == "dchi-text":
            raw_text_rates.extend(raws)
        stream = max(streaming_rate(x["stderr"]) for x in runs)
        tok_s = n_tok / r["wall"]
        results.append([
            name, f"{n_rec / r['wall']:,.0f}", f"{tok_s:,.0f}", f"{stream:,.0f}",
            "—" if raw is None else f"{raw:,.0f}",
            "—" if raw is None else f"{tok_s / raw:.0%}",
            "—" if raw is None else f"{stream / raw:.0%}",
            f"{cli_cpu:,.0f}", "—" if raw_cpu is None else f"{raw_cpu:,.0f}",
            "—" if raw_cpu is None else f"{cli_cpu / raw_cpu:.0%}",
            f"{max(x['rss_mib'] for x in runs):,.0f} MiB",
            f"{os.path.getsize(out) / 2**20:,.1f} MiB"])

    rows_dchi = [("dchi-text", "dchi-text", ["--mechanism", "dchi-text"], "dchi-text"),
                 ("dchi-embedding", "dchi-embedding", ["--mechanism", "dchi-embedding"],
                  "dchi-embedding"),
                 ("dchi-embedding-float16", "dchi-embedding --float16",
                  ["--mechanism", "dchi-embedding", "--float16"], "dchi-embedding")]
    for key, name, flags, raw_mech in rows_dchi:
        if args.only is None or key in args.only:
            e2e(name, [*flags, "--eta", str(eta)], raw_mech)
    export_s = None
    if not args.skip_vector:
        from models.export.writers import export_bundle

        t = time.perf_counter()
        enc_dir = export_bundle(tmp / "minilm-encoder")
        export_s = time.perf_counter() - t
        b = ["--bundle", str(tmp / "minilm-encoder")]
        assert enc_dir is not None
        e2e("laplace (eps=1, mu=0.1)", ["--mechanism", "laplace", "--epsilon", "1",
                                        "--word-dropout", "0.1", *b])
        e2e("ome (eps=1, lambda=2)", ["--mechanism", "ome", "--epsilon", "1", "--lam", "2",
                                      *b])
        e2e("texthide (m=256, k=4)", ["--mechanism", "texthide", "--m", "256", "--k", "4",
                                      "--texthide-key", secrets.token_hex(16), *b])

    sample = str(DATA / "sst2" / "dev.tsv")
    report_rows = []
    if not args.skip_report:
        rep = run_child(["report", "--eta", str(eta), "--tokens", str(args.report_tokens),
                         "--samples", str(args.report_samples), "--sample", sample, "--json"])
        rep_json = json.loads(rep["stdout"])
        queries = args.report_tokens * args.report_samples
        pd_s = rep_json["timings_s"]["plausible_deniability"]
        raw_pd_s = queries / max(raw_text_rates) if raw_text_rates else float("nan")
        tgt = json.loads(run_child(["report", "--target-inversion", str(args.target),
                                    "--tokens", "50", "--samples", "100", "--sample", sample,
                                    "--json"])["stdout"])
        report_rows = [
            [f"report: {args.report_tokens} tokens x {args.report_samples} perturbations + "
             "inversion table, eta " + f"{eta:g}", f"{rep['wall']:.1f} s", "< 180 s"],
            [f"  of which N_w/S_w ({queries:,} exact searches)", f"{pd_s:.1f} s",
             f"raw DChiText at this run's best rate: {raw_pd_s:.1f} s"],
            [f"report --target-inversion {args.target:g} (5,000 SST-2 dev tokens)",
             f"eta={tgt['eta']:.3f} reaches {tgt['inversion']['accuracy']:.4f} "
             f"(off by {abs(tgt['inversion']['accuracy'] - args.target):.4f})", "within 0.01"]]
    cold_spawn, cold_inside = (math.nan, math.nan) if args.skip_cold else cold_start(small, eta)
    ledger = ledger_rows(tsv, eta, out, args.ledger_repeats, tmp)
    calls = ledger_calls(tsv, eta, tmp)

    load_after = os.getloadavg()
    print(f"machine: {machine()}")
    print(f"load average (1 min) at start {load_before[0]:.2f}, at end {load_after[0]:.2f} "
          "(other processes share the cores)")
    print(f"{n_rec:,} SST-2 training sentences ({n_tok:,} tokens), eta={eta:g}, default MiniLM "
          "bundle; raw = the shared mechanism alone (fresh process) on the same tokens; best of "
          f"{args.repeats} alternating runs for dχ")
    print(table(["mechanism", "records/s", "tokens/s (wall)", "tokens/s (streaming)",
                 "raw tokens/s", "wall / raw", "streaming / raw", "streaming tokens/CPU s",
                 "raw tokens/CPU s", "CPU: streaming / raw", "peak RSS", "output"],
                results))
    print()
    print(table(["what", "result", "target"], report_rows + [
        ["cold start: spawn -> first JSONL line (median of 3)", f"{cold_spawn:.2f} s", "< 2 s"],
        ["cold start inside the CLI: start of run -> first record", f"{cold_inside:.2f} s", ""],
    ] + ([["export MiniLM bundle + encoder.onnx (models.export.writers, torch)", f"{export_s:.1f} s",
           ""]] if export_s is not None else [])))
    print()
    print_ledger(ledger, calls, n_rec, n_tok, args, load_before)


def print_ledger(rows: list[list], calls: dict[str, float], n_rec: int, n_tok: int, args,
                 load_before) -> None:
    print(f"ledger overhead: edge-agent privatize, dchi-text eta={args.eta:g}, {n_rec:,} "
          f"sentences ({n_tok:,} tokens), best of {args.ledger_repeats} alternating runs; "
          f"load average (1 min) at start {load_before[0]:.2f}, at end {os.getloadavg()[0]:.2f}")
    print(table(["run", "wall", "CPU", "tokens/s (streaming)", "wall vs no ledger",
                 "CPU vs no ledger", "CPU vs no ledger (medians)", "ledger file",
                 "every run, wall (s)", "every run, CPU (s)"], rows))
    base_cpu = float(rows[0][2].split()[0])
    print(table(["the ledger's own calls, one process (CPU seconds)", "CPU",
                 "share of the no-ledger CLI run's CPU"],
                [[what, f"{v:.2f} s", "—" if "no ledger" in what else f"{v / base_cpu:.1%}"]
                 for what, v in calls.items()]))
    own = next(v for what, v in calls.items() if what.endswith("new texts")) / base_cpu

    def verdict(x: float) -> str:
        return f"{x:+.1%} ({'met' if x <= 0.05 else 'NOT met'})"

    wall, cpu, med = (float(rows[1][i].rstrip("%")) / 100 for i in (4, 5, 6))
    print(f"target ledger overhead <= 5% (new texts, no cap): best wall {verdict(wall)}, "
          f"best CPU {verdict(cpu)}, median CPU {verdict(med)}; the ledger's own calls "
          f"{verdict(own)}")


if __name__ == "__main__":
    main()
