"""The web edge's speed: dχ-text privatization of one 20-token sentence in Node (warm), beside
the Python edge's per-sentence time on the same machine, in the same run.

    python bench/web_edge.py [--repeats 30] [--eta 65]

* Python: ``edge_agent.Privatizer(bundle, DChiText(bundle, eta)).privatize([sentence])`` per
  call (tokenize, noise, exact search, payload), warm, median of ``--repeats``.
* Node: the same in ``@privbert/edge`` (web_edge/dist, built by ``npm ci``): tokenizer,
  samplers, onnxruntime-web's WebAssembly MatMul for the candidate pass and the float64
  re-rank, payload JSON (bench/web_edge_node.mjs), one process per thread count, warm, median.
  The browser target is <= 50 ms warm; Node runs the same WebAssembly as a page.
* The two edges alternate (--rounds), best median of each, as other jobs share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, REPO, machine, read_tsv, table  # noqa: E402


def twenty_token_sentence(bundle) -> str:
    tok = bundle.text_tokenizer()
    for row in read_tsv(DATA / "sst2_sentences" / "dev.tsv"):
        if len(tok.encode(row[0], add_special_tokens=False).ids) == 20:
            return row[0]
    raise SystemExit("no 20-token sentence in dev.tsv")


def python_side(bundle, sentence: str, eta: float, repeats: int) -> dict:
    from edge_agent import Privatizer
    from shared.mechanisms import DChiText

    t0 = time.perf_counter()
    priv = Privatizer(bundle, DChiText(bundle, eta))
    setup = time.perf_counter() - t0
    for _ in range(3):
        priv.privatize([sentence])
    times = []
    c0 = time.process_time()
    for _ in range(repeats):
        t = time.perf_counter()
        priv.privatize([sentence])
        times.append(time.perf_counter() - t)
    cpu = (time.process_time() - c0) / repeats
    return {"median_ms": 1000 * statistics.median(times), "best_ms": 1000 * min(times),
            "setup_ms": 1000 * setup, "cpu_ms_per_call": 1000 * cpu}


def node_side(bundle_dir: Path, sentence: str, eta: float, repeats: int, threads: int) -> dict:
    p = subprocess.run(["node", str(REPO / "bench" / "web_edge_node.mjs"), str(bundle_dir),
                        sentence, str(eta), str(repeats), str(threads)],
                       capture_output=True, text=True, timeout=600, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--eta", type=float, default=65.0)
    args = ap.parse_args()
    from shared.bundle import EdgeBundle

    print(f"load average at start: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"machine: {machine()}")
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"node {node}, onnxruntime-web {json.loads((REPO / 'web_edge/node_modules/onnxruntime-web/package.json').read_text())['version']}")
    bundle = EdgeBundle.from_model()
    sentence = twenty_token_sentence(bundle)
    print(f"sentence (20 word pieces): {sentence!r}; eta={args.eta:g}; MiniLM table of "
          f"{bundle.regular_ids.size} regular tokens x {bundle.dim}")
    with tempfile.TemporaryDirectory() as tmp:
        bdir = bundle.save(Path(tmp) / "bundle")
        py, js1, js2 = [], [], []
        for _ in range(args.rounds):
            py.append(python_side(bundle, sentence, args.eta, args.repeats))
            js1.append(node_side(bdir, sentence, args.eta, args.repeats, 1))
            js2.append(node_side(bdir, sentence, args.eta, args.repeats, 2))
    best = lambda runs: min(runs, key=lambda r: r["median_ms"])  # noqa: E731
    py, js1, js2 = best(py), best(js1), best(js2)
    rows = [["Python edge (edge_agent.Privatizer, numpy/onnxruntime)",
             f"{py['median_ms']:.1f} ms", f"{py['best_ms']:.1f} ms", f"{py['cpu_ms_per_call']:.1f} ms",
             f"{py['setup_ms'] / 1000:.2f} s", "1.00x"]]
    for label, r in (("web edge in Node, wasm 1 thread", js1), ("web edge in Node, wasm 2 threads", js2)):
        rows.append([label, f"{r['median_ms']:.1f} ms", f"{r['best_ms']:.1f} ms",
                     f"{r['cpu_ms_per_call']:.1f} ms",
                     f"{r['setup_ms'] / 1000:.2f} s (+{r['load_bundle_ms'] / 1000:.2f} s bundle)",
                     f"{py['median_ms'] / r['median_ms']:.2f}x"])
    print(table(["dchi-text, one 20-token sentence, warm", "median", "best", "CPU/call",
                 "setup", "speed vs Python"], rows))
    print(f"web edge first call after setup: {js1['first_ms']:.1f} ms (1 thread), "
          f"{js2['first_ms']:.1f} ms (2 threads); target in a page: <= 50 ms warm")
    print(f"load average at end: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
