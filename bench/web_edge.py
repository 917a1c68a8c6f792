"""The web edge's speed: dχ-text privatization of one 20-token sentence in Node (warm), beside
the Python edge's per-sentence time on the same machine, in the same run; and, with
``--accuracy HOME``, the accuracy of its payloads beside the Python edge's.

    python -m bench.web_edge [--repeats 30] [--eta 65]
    python -m bench.web_edge --accuracy HOME [--draws 3] [--model sst2]

* Python: ``edge_agent.Privatizer(bundle, DChiText(bundle, eta)).privatize([sentence])`` per
  call (tokenize, noise, exact search, payload), warm, median of ``--repeats``.
* Node: the same in ``@privbert/edge`` (web_edge/dist, built by ``npm ci``): tokenizer,
  samplers, onnxruntime-web's WebAssembly MatMul for the candidate pass and the float64
  re-rank, payload JSON (bench/web_edge_node.mjs), one process per thread count, warm, median.
  The browser target is <= 50 ms warm; Node runs the same WebAssembly as a page.
* The two edges alternate (--rounds), best median of each, as other jobs share the cores.

``--accuracy HOME``: a real ``cloud-api serve`` on loopback for HOME (a dχ-text model, e.g. made
by ``cloud-api bootstrap`` with its defaults); every sentence of ``sst2_sentences/dev.tsv``
privatized ``--draws`` times by each edge's command line (``edge-agent privatize`` and
``privbert-edge privatize``, --server, OS entropy, --no-memo so that every draw is fresh), the
payloads sent to ``POST /v1/models/{id}/predict``, and the accuracy of each edge's predictions
against the labels. Target: the two accuracies within 0.01. The difference's standard error is
paired by sentence (each sentence's share of right answers, web edge minus Python edge).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import DATA, REPO, load_avg, machine, read_tsv, table


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


def predictions(url: str, key: str, model: str, out: Path) -> list[str]:
    """The model's label for each payload record of ``out`` (requests of 64 payloads)."""
    import httpx

    payloads = [json.loads(line)["payload"] for line in out.read_text().splitlines() if line]
    labels: list[str] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as c:
        for s in range(0, len(payloads), 64):
            r = c.post(f"/v1/models/{model}/predict", json={"payloads": payloads[s : s + 64]})
            r.raise_for_status()
            labels += [str(p["label"]) for p in r.json()["predictions"]]
    return labels


def accuracy(home: Path, model: str, draws: int, limit: int) -> None:
    """Both edges' payloads of dev.tsv through one served model: accuracies and difference."""
    import numpy as np

    from bench.common import cli_env, serve

    rows = read_tsv(DATA / "sst2_sentences" / "dev.tsv", limit or None)
    gold = np.array([r[-1] for r in rows])
    print(f"load average at start: {load_avg()}")
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        text = tmp / "dev.txt"
        text.write_text("".join(r[0] + "\n" for r in rows), encoding="utf-8")
        proc, url, key = serve(home, tmp / "serve.log", demo=False)
        try:
            import httpx

            models = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
            info = next(m for m in models["models"] if m["id"] == model)
            eta = float(info["params"]["eta"])
            print(f"model {model} {info.get('version')} ({info['mechanism']}, eta={eta:g}, bundle "
                  f"{info['bundle_id'][:12]}); {len(rows)} sentences of sst2_sentences/dev.tsv, "
                  f"{draws} draws per edge, OS entropy")
            env = cli_env({"PRIVBERT_CACHE": str(tmp / "cache"), "PRIVBERT_LEDGER": str(tmp / "py.sqlite3"),
                           "PRIVBERT_EDGE_LEDGER": str(tmp / "js-ledger.json")})
            common = [str(text), "--mechanism", "dchi-text", "--eta", f"{eta:g}", "--server", url,
                      "--model", model, "--api-key", key, "--no-memo"]
            edges = {"Python edge (edge-agent)": [sys.executable, "-m", "edge_agent", "privatize",
                                                  *common, "--no-progress"],
                     "web edge (privbert-edge, Node)": ["node", str(REPO / "web_edge/bin/privbert-edge.js"),
                                                        "privatize", *common]}
            right = {name: [] for name in edges}
            seconds = {name: [] for name in edges}
            for d in range(draws):  # the edges alternate, draw by draw
                for name, cmd in edges.items():
                    out = tmp / f"out-{d}.jsonl"
                    t0 = time.perf_counter()
                    subprocess.run([*cmd, "-o", str(out)], cwd=REPO, env=env, check=True,
                                   capture_output=True, text=True, timeout=3600)
                    seconds[name].append(time.perf_counter() - t0)
                    pred = np.array(predictions(url, key, model, out))
                    if pred.size != gold.size:
                        raise SystemExit(f"{name}: {pred.size} predictions for {gold.size} sentences")
                    right[name].append(pred == gold)
        finally:
            proc.terminate()
            proc.wait(30)
    table_rows = []
    for name in edges:
        acc = [float(r.mean()) for r in right[name]]
        table_rows.append([name, f"{np.mean(acc):.4f}", ", ".join(f"{a:.4f}" for a in acc),
                           f"{np.mean(seconds[name]):.0f} s"])
    print(table(["edge", "accuracy (mean)", "per draw", "privatize time per draw"], table_rows))
    py, js = (np.mean(right[name], axis=0) for name in edges)  # per sentence, over the draws
    diff = js - py
    se = float(diff.std(ddof=1) / np.sqrt(diff.size))
    verdict = "met" if abs(diff.mean()) <= 0.01 else "NOT met"
    print(f"difference (web - Python): {diff.mean():+.4f} (paired standard error {se:.4f}) | "
          f"target |difference| <= 0.01: {verdict}")
    print(f"load average at end: {load_avg()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--eta", type=float, default=65.0)
    ap.add_argument("--accuracy", type=Path, metavar="HOME",
                    help="compare the edges' accuracy through the model served from HOME")
    ap.add_argument("--model", default="sst2", help="--accuracy: the served model (sst2)")
    ap.add_argument("--draws", type=int, default=3, help="--accuracy: draws per edge (3)")
    ap.add_argument("--limit", type=int, default=0, help="--accuracy: first N dev sentences (0: all)")
    args = ap.parse_args()
    if args.accuracy is not None:
        accuracy(args.accuracy, args.model, args.draws, args.limit)
        return
    from shared.bundle import EdgeBundle

    print(f"load average at start: {load_avg()}")
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
    print(f"load average at end: {load_avg()}")


if __name__ == "__main__":
    main()
