"""Serving throughput and latency: ``cloud-api serve`` (micro-batcher) against naive servers
and Ray Serve, on the same model, payloads and load generator, in the same run.

Closed-loop load (each of C clients sends its next request when the last one is answered,
on its own keep-alive connection; a raw HTTP/1.1 client of asyncio streams, the same for
every server) at concurrency 1, 8 and 32: ``dchi-text`` (η = 65) predict requests of one
payload each, privatized SST-2 dev sentences, on a MiniLM-L6 classifier trained briefly on
a few hundred SST-2 training rows (accuracy does not matter here; the model and its ONNX
files are cached under ``var/bench/serve/``; ``--model DIR`` serves another version
folder). For each backend (torch, onnx, onnx-int8), in the same run:

* ``cloud-api serve`` as a subprocess on a loopback port (the real HTTP stack: auth,
  limits, problem+json, metrics, access log, the micro-batcher);
* the naive baseline: a minimal FastAPI app served by uvicorn in a subprocess that runs one
  forward per request, no batching, in two flavours: ``serial`` (the forward inline on the
  event loop: one at a time) and ``threads`` (the forward in Starlette's thread pool, as a
  plain ``def`` endpoint does: concurrent forwards);
* with ``--ray`` (onnx backends): Ray Serve (``bench/ray_server.py``: the same exported
  file behind a deployment with ``@serve.batch``); ``--ray-tune`` first sweeps its
  ``max_batch_size`` x ``batch_wait_timeout_s`` at c=32 and keeps the fastest;
* bare forwards of the backend on one payload in this process (no HTTP), and for
  onnx-int8 of the fp32 onnx file too (the int8 speed-up).

Every server is up at once and, at each concurrency, they take turns in rounds, so the
other jobs of a shared machine weigh on all of them alike. Besides req/s and latency, the
CPU time each server spends per request is read from /proc (every process of its session:
Ray's GCS, raylet, proxy and replica included). On a machine that other jobs load, a
server's req/s follows the CPU share the scheduler gives its threads (a thread pool of 32
gets more than two threads do); the CPU per request does not, and its ratio is what the
req/s ratio tends to on cores nobody else uses. ``--padding`` measures what padding costs
one forward and a forward's fixed cost; ``--dispatch`` compares the batcher's dedicated
inference thread with ``asyncio.to_thread``'s shared pool.

Targets (serving near the hardware's limit; one ``target ...: met / NOT met`` line each,
with the load average):
int8 forward >= 1.8x fp32's; c=1 p50 <= the naive serial server's + 0.3 ms; c=32 >= 1.5x
the naive threaded server and >= 2x Ray Serve; c=32 p99 <= 2.5x p50; c=32 >= 400 req/s.
The int8 accuracy target is ``bench/int8.py``'s.

    python -m bench.serve --quick                # onnx-int8, c=1 and 32, Ray tuned: ~4 min
    git worktree add --detach /tmp/before main && python -m bench.serve --quick --baseline \
        /tmp/before                              # a change against main, in the same rounds
    python -m bench.serve --threads 1            # torch and onnx, about 6 minutes
    python -m bench.serve --padding --threads 1 --backends onnx onnx-int8
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fastapi import Request, Response  # the naive app's annotations

from bench.common import (
    DATA,
    REPO,
    free_port,
    machine,
    module_cmd,
    pct,
    read_tsv,
    repo_env,
    session_cpu,
    start_server,
    stop_server,
    table,
)

MODEL_ID = "sst2-minilm"
API_KEY = "bench-app-key"
ETA = 65.0


# -- set-up: a briefly trained MiniLM classifier, its ONNX export, a home -------------------
def prepare(work: Path, rows: int, model: Path | None = None) -> tuple[Path, Path]:
    """The cached model version folder (or ``model``) and a home serving it (built on the
    first run), with its fp32 and int8 ONNX files."""
    from cloud_api.home import ModelHome
    from models.training.experiment import train_from_tsv
    from models.training.finetune import TrainConfig
    from models.versions.version_folder import ONNX_FILE

    if model is not None:
        work = work / f"given-{model.resolve().name}"
    model = model or work / f"model-{rows}"
    if not (model / "config.json").is_file():
        t0 = time.perf_counter()
        train_from_tsv(DATA / "sst2" / "train.tsv", model, "dchi-text", {"eta": ETA},
                       dev_tsv=DATA / "sst2" / "dev.tsv", limit=rows, dev_limit=100,
                       cfg=TrainConfig(epochs=1, batch_size=16, progress=False, seed=0))
        print(f"trained {model} on {rows} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    if not (model / ONNX_FILE).is_file():
        from models.export.writers import export_classifier_onnx

        t0 = time.perf_counter()
        export_classifier_onnx(model)
        print(f"exported {ONNX_FILE} and its int8 version in {time.perf_counter() - t0:.0f} s",
              flush=True)
    from models.export.quantize import has_current_int8, quantize_classifier

    if not has_current_int8(model):
        t0 = time.perf_counter()
        quantize_classifier(model)
        print(f"quantized {ONNX_FILE} in {time.perf_counter() - t0:.0f} s", flush=True)
    home = ModelHome(work / "home").ensure()
    if home.promoted(MODEL_ID) is not None and not has_current_int8(
            home.version_dir(MODEL_ID, home.promoted(MODEL_ID))):
        shutil.rmtree(home.root)  # an older cache: register the model again
        home = ModelHome(work / "home").ensure()
    if home.promoted(MODEL_ID) is None:
        home.promote(MODEL_ID, home.register(MODEL_ID, model))
    return model, home.root


def request_bodies(n: int, model: Path) -> list[bytes]:
    """``{"payloads": [one payload]}`` for the first ``n`` SST-2 dev sentences, made with
    the model's bundle and η (the default MiniLM bundle, or its base BERT folder's)."""
    from edge_agent import Privatizer
    from models.versions.version_folder import read_config
    from shared.bundle import EdgeBundle
    from shared.mechanisms import DChiText

    cfg = read_config(model)
    base = cfg.get("base_model")
    bundle = EdgeBundle.from_model(base if base and Path(base).is_dir() else None)
    assert bundle.bundle_id == cfg["bundle_id"], "the model's bundle cannot be rebuilt here"
    texts = [r[0] for r in read_tsv(DATA / "sst2" / "dev.tsv", n)]
    payloads = Privatizer(bundle, DChiText(bundle, float(cfg["params"]["eta"]))).privatize(
        texts)
    return [b'{"payloads":[' + p.model_dump_json(exclude_none=True).encode() + b"]}"
            for p in payloads]


# -- the naive server (runs in a subprocess: python -m bench.serve --naive ...) --------------
def naive_app(model_dir: str, backend: str, mode: str, threads: int | None = None):
    """FastAPI app: parse the body, one forward per payload, answer; nothing else."""
    import numpy as np
    import orjson
    from fastapi import FastAPI
    from pydantic import BaseModel
    from starlette.concurrency import run_in_threadpool

    from models.versions.model_version import load_model
    from shared.payload import Payload

    class Body(BaseModel):
        payloads: list[Payload]

    mv = load_model(model_dir)
    if backend in ("onnx", "onnx-int8"):
        from models.export.onnx_classifier import OnnxClassifier

        # the same session options and file as the service's onnx backends
        onnx = OnnxClassifier(model_dir, threads=threads or None, int8=backend == "onnx-int8")

        def forward(p) -> np.ndarray:
            return onnx.predict_proba([p])[0]
    else:
        import torch

        def forward(p) -> np.ndarray:
            with torch.inference_mode():
                logits = mv.module(**mv.collate([p]))
                return torch.softmax(logits.float(), dim=-1)[0].numpy()

    labels = mv.labels

    def answer(body: bytes) -> bytes:
        parsed = Body.model_validate_json(body)
        preds = []
        for p in parsed.payloads:
            mv.check_payload(p)
            probs = forward(p)
            preds.append({"label": labels[int(probs.argmax())],
                          "scores": dict(zip(labels, probs.tolist(), strict=True))})
        return orjson.dumps({"model_id": MODEL_ID, "version": "v1", "predictions": preds})

    app = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})  # as ours

    @app.post("/v1/models/{model_id}/predict")
    async def predict(model_id: str, request: Request) -> Response:
        body = await request.body()
        out = answer(body) if mode == "serial" else await run_in_threadpool(answer, body)
        return Response(out, media_type="application/json")

    @app.get("/readyz")
    async def readyz() -> dict:
        return {"status": "ok"}

    return app


def run_naive(args) -> None:
    import uvicorn

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    app = naive_app(args.naive_model, args.backend, args.naive, args.threads)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


# -- processes --------------------------------------------------------------------------------
def serve_cmd(home: Path, port: int) -> list[str]:
    exe = Path(sys.executable).with_name("cloud-api")
    return [str(exe), "serve", "--host", "127.0.0.1", "--port", str(port), "--home", str(home)]


def serve_env(backend: str, threads: int | None, workers: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PRIVBERT_INFERENCE_WORKERS"}
    if workers is not None:  # else the server's default (Settings.workers)
        env["PRIVBERT_INFERENCE_WORKERS"] = str(workers)
    env.update({"PRIVBERT_API_KEYS": API_KEY, "PRIVBERT_ADMIN_KEYS": API_KEY + "-admin",
                "PRIVBERT_BACKEND": backend, "PRIVBERT_RATE_LIMIT_PER_KEY": "0",
                "PRIVBERT_LOG_LEVEL": "WARNING", "PRIVBERT_WORKER_IN_SERVE": "0"})
    if threads:
        env["PRIVBERT_TORCH_THREADS"] = str(threads)
    return env


# -- load -------------------------------------------------------------------------------------
async def closed_loop(port: int, bodies: list[bytes], concurrency: int, seconds: float,
                      warmup: float, path: str | None = None) -> dict:
    """``concurrency`` clients, each on its own keep-alive HTTP/1.1 connection, sending its
    next request on the last one's answer. The requests are written as prepared bytes and
    the answers read with asyncio streams (status line, Content-Length, body): about 30 us
    of client CPU a request where httpx took about 400, so that the client, which shares
    the machine, weighs less on every server alike."""
    path = path or f"/v1/models/{MODEL_ID}/predict"
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n")
    requests = [(head + f"Content-Length: {len(b)}\r\n\r\n").encode() + b for b in bodies]
    lat: list[float] = []
    errors: list[str] = []
    done = [0]
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup, t_start + warmup + seconds

    async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
        header = await reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        length = 0
        for line in header.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await reader.readexactly(length)

    async def worker(k: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            i = k
            while True:
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                writer.write(requests[i % len(requests)])
                status, body = await answer(reader)
                t1 = time.perf_counter()
                i += concurrency
                done[0] += 1
                if status != 200:
                    errors.append(f"{status} {body[:200].decode(errors='replace')}")
                elif t0 >= t_measure:
                    lat.append(t1 - t0)
        finally:
            writer.close()

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return {"lat": lat, "errors": errors, "done": done[0]}


def batch_stats(port: int) -> tuple[float, float]:
    """(sum, count) of privbert_batch_size from /metrics."""
    import httpx

    s = c = 0.0
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
        if line.startswith("privbert_batch_size_sum"):
            s += float(line.rsplit(" ", 1)[1])
        elif line.startswith("privbert_batch_size_count"):
            c += float(line.rsplit(" ", 1)[1])
    return s, c


def payloads_of(bodies: list[bytes]) -> list:
    """The one payload of each request body, parsed."""
    from shared.payload import parse_payload

    return [parse_payload(json.loads(b)["payloads"][0]) for b in bodies]


def in_process_backend(model_dir: Path, backend: str, threads: int | None):
    """The service's backend over ``model_dir`` in this process, as serve would load it."""
    from cloud_api.serving.backends import load_backend
    from cloud_api.settings import Settings

    return load_backend(model_dir, Settings(home=model_dir.parent, backend=backend,
                                            torch_threads=threads, auth_disabled=True))


class Bare:
    """One backend forward on one payload in this process (no HTTP), same payloads."""

    def __init__(self, model_dir: Path, backend: str, bodies: list[bytes], threads: int | None):
        self.payloads = payloads_of(bodies)
        self.backend = in_process_backend(model_dir, backend, threads)
        self.times: list[float] = []
        self.i = 0

    def measure(self, seconds: float) -> None:
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            self.backend.forward([self.payloads[self.i % len(self.payloads)]])
            self.times.append(time.perf_counter() - t0)
            self.i += 1

    def close(self) -> None:
        self.backend.close()


async def _batcher_load(batcher, payloads: list, concurrency: int, seconds: float) -> dict:
    lat: list[float] = []
    t_end = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        i = k
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            await batcher.run([payloads[i % len(payloads)]])
            lat.append(time.perf_counter() - t0)
            i += concurrency

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    lat.sort()
    return {"rps": len(lat) / seconds, "p50": pct(lat, 50)}


def dispatch_compare(model_dir: Path, backend: str, bodies: list[bytes], threads: int | None,
                     seconds: float) -> list[list]:
    """The batcher's forward in one dedicated thread per version against the event loop's
    shared default pool (what ``asyncio.to_thread`` uses), in this process, no HTTP."""
    from concurrent.futures import ThreadPoolExecutor

    from cloud_api.serving.batcher import Batcher

    payloads = payloads_of(bodies)
    be = in_process_backend(model_dir, backend, threads)
    rows = []
    for name in ("dedicated thread", "shared pool (to_thread)"):
        for c in (1, 8):
            async def go(c=c, name=name) -> dict:
                pool = None if name.startswith("dedicated") else ThreadPoolExecutor(
                    max_workers=min(32, (os.cpu_count() or 1) + 4))
                b = Batcher(be.forward, model_id="bench", version="v1", executor=pool).start_server()
                await _batcher_load(b, payloads, c, 1.0)  # warm-up
                r = await _batcher_load(b, payloads, c, seconds)
                await b.drain()
                if pool is not None:
                    pool.shutdown()
                return r

            r = asyncio.run(go())
            rows.append([backend, f"batcher, {name}, no HTTP", c, "", f"{r['rps']:.1f}",
                         f"{r['p50'] * 1e3:.2f}", "", "", "", "", ""])
            print(f"  {backend:5s} {name:24s} c={c:<3d} {r['rps']:7.1f} req/s  "
                  f"p50 {r['p50'] * 1e3:7.2f} ms", flush=True)
    be.close()
    return rows


def padding_cost(model_dir: Path, backend: str, bodies: list[bytes], threads: int | None
                 ) -> list[list]:
    """CPU time per payload of one forward over batches of 1, and of 16 and 32 payloads
    either in arrival order (padded to their longest) or neighbours in length; and the
    fixed cost of a forward in padded tokens: at equal padded lengths T (6 .. 46), a
    forward of one payload against a forward of 16 (``cost(1) - cost(16) / 16``, in
    tokens of ``cost(16) / (16 T)``), the median over T. That is the backend's
    ``overhead_tokens`` which the batcher's split (``best_groups``) trades padding against."""
    import numpy as np

    from cloud_api.serving.payload_queue import payload_length
    from shared.payload import make_payload

    ps = payloads_of(bodies)
    srt = sorted(ps, key=payload_length)
    be = in_process_backend(model_dir, backend, threads)
    rows = []
    for n, name, seq in ((1, "one payload", ps), (16, "16 in arrival order", ps),
                         (16, "16 neighbours in length", srt), (32, "32 in arrival order", ps),
                         (32, "32 neighbours in length", srt)):
        cpu = tokens = count = 0.0
        for s in range(0, len(seq), n * (4 if n == 1 else 1)):
            batch = seq[s: s + n]
            t0 = time.thread_time()
            be.forward(batch)
            cpu += time.thread_time() - t0
            tokens += len(batch) * max(payload_length(p) for p in batch)
            count += len(batch)
        rows.append([backend, name, f"{tokens / count:.1f}", f"{cpu / count * 1e3:.2f}"])
        print(f"  {backend:5s} {name:24s} {tokens / count:5.1f} padded tokens/payload "
              f"{cpu / count * 1e3:6.2f} CPU ms/payload", flush=True)
    p0 = ps[0]
    rng = np.random.default_rng(0)
    fixed = []
    for t in (6, 10, 14, 20, 30, 46):
        group = [make_payload(p0.mechanism, p0.params.model_dump(), p0.bundle_id,
                              rng.choice(p0.data_array(), size=t - 2)) for _ in range(16)]
        one, many = [], []
        for _ in range(8):  # the lower quartile: the least disturbed by the machine's load
            t0 = time.thread_time()
            be.forward(group[:1])
            one.append(time.thread_time() - t0)
            t0 = time.thread_time()
            be.forward(group)
            many.append(time.thread_time() - t0)
        c1, c16 = np.percentile(one, 25), np.percentile(many, 25) / 16
        fixed.append((c1 - c16) / (c16 / t))
    be.close()
    rows.append([backend, "a forward's fixed cost (1 vs 16 at equal length)",
                 f"{np.median(fixed):.0f} tokens", ""])
    return rows


# -- main -------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=REPO / "var" / "bench" / "serve")
    ap.add_argument("--rows", type=int, default=300, help="SST-2 rows to train on (300)")
    ap.add_argument("--model", type=Path, help="serve this model version folder instead "
                    "(exported and quantized here when its files are missing)")
    ap.add_argument("--requests", type=int, default=512, help="distinct request bodies")
    ap.add_argument("--backends", nargs="+", default=["torch", "onnx"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per turn")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per turn")
    ap.add_argument("--rounds", type=int, default=3, help="turns of each server per level")
    ap.add_argument("--threads", type=int, help="PRIVBERT_TORCH_THREADS, also for the naive "
                    "servers and the bare forward (default: torch's, one per core)")
    ap.add_argument("--workers", type=int, help="PRIVBERT_INFERENCE_WORKERS (default: the "
                    "server's own, one per --threads of the cores for onnx, 1 for torch)")
    ap.add_argument("--max-wait-ms", type=float, help="PRIVBERT_MAX_WAIT_MS (default: "
                    "the setting's)")
    ap.add_argument("--naive-flavours", nargs="+", default=["serial", "threads"])
    ap.add_argument("--padding", action="store_true", help="only measure what padding costs "
                    "one forward (CPU time, no HTTP) and exit")
    ap.add_argument("--dispatch", action="store_true", help="also compare the batcher's "
                    "dedicated inference thread with asyncio.to_thread's shared pool")
    ap.add_argument("--ray", action="store_true", help="also Ray Serve (bench.ray_server, "
                    "onnx backends; pip install 'privbert[bench]')")
    ap.add_argument("--ray-tune", action="store_true", help="sweep Ray's max_batch_size x "
                    "batch_wait_timeout_s at c=32 first and keep the fastest")
    ap.add_argument("--ray-tune-seconds", type=float, default=2.0)
    ap.add_argument("--ray-max-batch-size", type=int, default=16)
    ap.add_argument("--ray-batch-wait-timeout-s", type=float, default=0.002)
    ap.add_argument("--quick", action="store_true", help="the serving targets in a few "
                    "minutes: onnx-int8, c=1 and 32, both naive servers, Ray Serve tuned "
                    "(when installed), 2 rounds of 3 s")
    ap.add_argument("--baseline", type=Path, help="also serve with the cloud-api of this "
                    "other checkout (a git worktree of the commit before a change), taking "
                    "turns with this one's in every round: a change and its baseline measured "
                    "in the same run")
    # internal: run the naive server
    ap.add_argument("--naive", choices=["serial", "threads"], help=argparse.SUPPRESS)
    ap.add_argument("--naive-model", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.naive:
        run_naive(args)
        return 0
    if args.quick:
        args.backends, args.concurrency, args.rounds = ["onnx-int8"], [1, 32], 2
        args.seconds, args.ray_tune, args.ray_tune_seconds = 3.0, True, 1.5
        args.ray = importlib.util.find_spec("ray") is not None
        if not args.ray:
            print("ray is not installed: Ray Serve left out (pip install 'privbert[bench]')",
                  flush=True)
        args.threads = args.threads or 1
        args.naive_flavours = ["serial", "threads"]

    t_all = time.perf_counter()
    print(f"machine: {machine()}", flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; torch/onnxruntime threads "
          f"{args.threads or 'default'}, inference workers {args.workers or 'the server default'}", flush=True)
    model, home = prepare(args.work, args.rows, args.model)
    bodies = request_bodies(args.requests, model)
    lengths = [json.loads(b)["payloads"][0]["token_ids"]["shape"][0] for b in bodies]
    print(f"{len(bodies)} requests of one dchi-text payload (eta {ETA:g}), "
          f"{statistics.mean(lengths):.1f} tokens on average (max {max(lengths)}); closed "
          f"loop; per level {args.rounds} rounds of {args.warmup:g} s warm-up + "
          f"{args.seconds:g} s measured, the servers taking turns within each round",
          flush=True)

    if args.padding:
        prows = []
        for backend in args.backends:
            prows += padding_cost(model, backend, bodies, args.threads)
        print()
        print(table(["backend", "batch", "padded tokens/payload", "CPU ms/payload"], prows))
        return 0
    rows, verdicts = [], []
    for backend in args.backends:
        rows_b, verdicts_b = run_backend(args, backend, model, home, bodies)
        rows += rows_b
        verdicts += verdicts_b
    print()
    print(table(["backend", "server", "conc.", "requests", "req/s", "p50 ms", "p99 ms",
                 "p99/p50", "CPU ms/req", "mean batch", "vs best naive"], rows))
    print()
    for v in verdicts:
        print(v)
    print(f"load average at end: {os.getloadavg()[0]:.2f}; wall clock "
          f"{time.perf_counter() - t_all:.0f} s")
    return 0


SERVE = "cloud-api serve"
BASELINE = "cloud-api serve (baseline)"


RAY = "ray serve"
RAY_GRID = ((8, 16, 32), (0.0, 0.002, 0.005, 0.01))  # max_batch_size x batch_wait_timeout_s


def start_ray(args, backend: str, model: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = module_cmd("bench.ray_server", "--model", str(model), "--port", str(port),
                     "--max-batch-size", str(args.ray_max_batch_size),
                     "--batch-wait-timeout-s", str(args.ray_batch_wait_timeout_s))
    if backend == "onnx-int8":
        cmd.append("--int8")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return start_server(cmd, repo_env(), port, timeout=600), port


def ray_tune(port: int, bodies: list[bytes], seconds: float) -> tuple[int, float, list[list]]:
    """Ray Serve's two batch knobs swept at concurrency 32 on the running deployment (its
    ``POST /tune``), each point 0.5 s of warm-up and ``seconds`` measured; the fastest
    pair is kept. Returns (max_batch_size, batch_wait_timeout_s, table rows)."""
    import httpx

    rows, best = [], (0.0, 0, 0.0)
    for size in RAY_GRID[0]:
        for wait in RAY_GRID[1]:
            httpx.post(f"http://127.0.0.1:{port}/tune", timeout=30,
                       json={"max_batch_size": size, "batch_wait_timeout_s": wait})
            r = asyncio.run(closed_loop(port, bodies, 32, seconds, 0.5))
            rps = len(r["lat"]) / seconds
            lat = sorted(r["lat"])
            rows.append([size, wait, f"{rps:.1f}", f"{pct(lat, 50) * 1e3:.1f}",
                         f"{pct(lat, 99) * 1e3:.1f}", f"{os.getloadavg()[0]:.2f}"])
            print(f"  ray tune max_batch_size={size:<3d} batch_wait_timeout_s={wait:<6g} "
                  f"{rps:7.1f} req/s (load {os.getloadavg()[0]:.2f})", flush=True)
            best = max(best, (rps, size, wait))
    httpx.post(f"http://127.0.0.1:{port}/tune", timeout=30,
               json={"max_batch_size": best[1], "batch_wait_timeout_s": best[2]})
    return best[1], best[2], rows


def run_backend(args, backend: str, model: Path, home: Path, bodies: list[bytes]
                ) -> tuple[list[list], list[str]]:
    """Every server of ``backend`` up at once; at each level, rounds in which each server
    (and, at c=1, the bare forwards) takes its turn, so that the load of this shared
    machine falls on all of them alike."""
    rows: list[list] = []
    if args.dispatch:
        rows += dispatch_compare(model, backend, bodies, args.threads, args.seconds)
    procs: dict[str, tuple[subprocess.Popen, int]] = {}
    bares: dict[str, Bare] = {}
    ray_note = ""
    try:
        port = free_port()
        env = serve_env(backend, args.threads, args.workers)
        if args.max_wait_ms is not None:
            env["PRIVBERT_MAX_WAIT_MS"] = str(args.max_wait_ms)
        procs[SERVE] = (start_server(serve_cmd(home, port), env, port), port)
        if args.baseline is not None:
            port = free_port()
            base_env = {**env, "PYTHONPATH": str(args.baseline.resolve())}
            procs[BASELINE] = (start_server(serve_cmd(home, port), base_env, port), port)
        for flavour in args.naive_flavours:
            port = free_port()
            cmd = module_cmd("bench.serve", "--naive", flavour, "--naive-model", str(model),
                             "--backend", backend, "--port", str(port))
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            procs[f"naive ({flavour})"] = (start_server(cmd, repo_env(), port), port)
        if args.ray and backend in ("onnx", "onnx-int8"):
            t0 = time.perf_counter()
            procs[RAY] = start_ray(args, backend, model)
            print(f"  ray serve up in {time.perf_counter() - t0:.0f} s", flush=True)
            size, wait = args.ray_max_batch_size, args.ray_batch_wait_timeout_s
            if args.ray_tune:
                size, wait, grid = ray_tune(procs[RAY][1], bodies, args.ray_tune_seconds)
                print()
                print(table(["max_batch_size", "batch_wait_timeout_s", "req/s at c=32",
                             "p50 ms", "p99 ms", "load"], grid))
            ray_note = f"ray serve: max_batch_size={size}, batch_wait_timeout_s={wait:g}"
            print(f"  {ray_note}", flush=True)
        bares[backend] = Bare(model, backend, bodies, args.threads)
        if backend == "onnx-int8":  # the forward-ratio target's baseline, same rounds
            bares["onnx"] = Bare(model, "onnx", bodies, args.threads)
        res: dict[str, dict[int, dict]] = {n: {} for n in procs}
        for c in args.concurrency:
            acc = {n: {"lat": [], "seconds": 0.0, "errors": [], "cpu": 0.0, "done": 0}
                   for n in procs}
            before = batch_stats(procs[SERVE][1])
            names = list(procs)
            for rnd in range(args.rounds):
                for name in names[rnd % len(names):] + names[: rnd % len(names)]:
                    cpu0 = session_cpu(procs[name][0].pid)
                    r = asyncio.run(closed_loop(procs[name][1], bodies, c, args.seconds,
                                                args.warmup))
                    a = acc[name]
                    a["cpu"] += session_cpu(procs[name][0].pid) - cpu0
                    a["done"] += r["done"]
                    a["lat"] += r["lat"]
                    a["seconds"] += args.seconds
                    a["errors"] += r["errors"]
                if c == 1:
                    for bare in bares.values():
                        bare.measure(args.seconds / 2)
            after = batch_stats(procs[SERVE][1])
            for name, a in acc.items():
                lat = sorted(a["lat"])
                res[name][c] = {"n": len(lat), "rps": len(lat) / a["seconds"],
                                "p50": pct(lat, 50), "p99": pct(lat, 99),
                                "errors": a["errors"], "cpu": a["cpu"] / max(1, a["done"])}
                if name == SERVE:
                    res[name][c]["batch"] = (after[0] - before[0]) / max(1.0,
                                                                          after[1] - before[1])
                r = res[name][c]
                print(f"  {backend:5s} {name:18s} c={c:<3d} {r['rps']:7.1f} req/s  p50 "
                      f"{r['p50'] * 1e3:7.2f} ms  p99 {r['p99'] * 1e3:7.2f} ms  CPU "
                      f"{r['cpu'] * 1e3:6.2f} ms/req  errors {len(r['errors'])}  load "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
        bare_p50 = {k: statistics.median(b.times) if b.times else float("nan")
                    for k, b in bares.items()}
        bare_min = {k: min(b.times) if b.times else float("nan") for k, b in bares.items()}
    finally:
        for bare in bares.values():
            bare.close()
        for proc, _ in procs.values():
            stop_server(proc)
    for k, b in bares.items():
        if b.times:
            rows.append([k, "bare forward, 1 payload, no HTTP", 1, len(b.times), "",
                         f"{bare_p50[k] * 1e3:.2f}", "", "", "", "", ""])
    naive_best = {c: max((res[n][c]["rps"] for n in res if n.startswith("naive")),
                         default=0.0) for c in args.concurrency}
    for name in res:
        for c, r in res[name].items():
            vs = (r["rps"] / naive_best[c] if name == SERVE and naive_best[c] > 0
                  else float("nan"))
            rows.append([backend, name, c, r["n"], f"{r['rps']:.1f}", f"{r['p50'] * 1e3:.2f}",
                         f"{r['p99'] * 1e3:.2f}", f"{r['p99'] / r['p50']:.2f}",
                         f"{r['cpu'] * 1e3:.2f}", f"{r['batch']:.1f}" if "batch" in r else "",
                         f"{vs:.2f}x" if vs == vs else ""])
            if r["errors"]:
                print(f"{backend} {name} c={c}: {len(r['errors'])} errors, first: "
                      f"{r['errors'][0]}")
    verdicts = [ray_note] if ray_note else []
    return rows, verdicts + targets(backend, res, bare_p50, bare_min)


def _line(what: str, value: str, ok: bool | None) -> str:
    state = "not measured" if ok is None else ("met" if ok else "NOT met")
    return f"target {what}: {value} ({state}) [load average {os.getloadavg()[0]:.2f}]"


def targets(backend: str, res: dict, bare_p50: dict, bare_min: dict) -> list[str]:
    """One line per serving target that this run measures (the int8 backend's; the
    accuracy target is bench/int8.py's)."""
    out = [f"-- serving targets for the {backend} backend:"]
    srv = res[SERVE]
    if backend == "onnx-int8" and bare_p50.get("onnx", float("nan")) == bare_p50["onnx"]:
        med = bare_p50["onnx"] / bare_p50[backend]
        low = bare_min["onnx"] / bare_min[backend]
        out.append(_line("int8 forward vs fp32 onnx forward of one payload >= 1.8x",
                         f"{med:.2f}x on medians ({bare_p50['onnx'] * 1e3:.2f} against "
                         f"{bare_p50[backend] * 1e3:.2f} ms), {low:.2f}x on minima",
                         med >= 1.8))
    out.append("target int8 accuracy within 0.5 point of fp32: measured by "
               "`python -m bench.int8` (not measured here)")
    serial = res.get("naive (serial)", {})
    if 1 in srv and 1 in serial:
        extra = (srv[1]["p50"] - serial[1]["p50"]) * 1e3
        out.append(_line("c=1 p50 <= naive serial server's p50 + 0.3 ms",
                         f"{srv[1]['p50'] * 1e3:.2f} against {serial[1]['p50'] * 1e3:.2f} "
                         f"ms ({extra:+.2f} ms); CPU per request {srv[1]['cpu'] * 1e3:.2f} "
                         f"against {serial[1]['cpu'] * 1e3:.2f} ms", extra <= 0.3))
    if 32 in srv:
        threads = res.get("naive (threads)", {}).get(32)
        if threads:
            ratio = srv[32]["rps"] / threads["rps"]
            out.append(_line("c=32 vs the naive threaded server >= 1.5x",
                             f"{ratio:.2f}x ({srv[32]['rps']:.1f} against "
                             f"{threads['rps']:.1f} req/s); CPU per request "
                             f"{srv[32]['cpu'] * 1e3:.2f} against "
                             f"{threads['cpu'] * 1e3:.2f} ms", ratio >= 1.5))
        ray = res.get(RAY, {}).get(32)
        if ray:
            ratio = srv[32]["rps"] / ray["rps"]
            out.append(_line("c=32 vs Ray Serve >= 2x the req/s",
                             f"{ratio:.2f}x ({srv[32]['rps']:.1f} against {ray['rps']:.1f} "
                             f"req/s); CPU per request {srv[32]['cpu'] * 1e3:.2f} against "
                             f"{ray['cpu'] * 1e3:.2f} ms (all of Ray's processes)",
                             ratio >= 2))
        spread = srv[32]["p99"] / srv[32]["p50"]
        out.append(_line("c=32 tail p99 <= 2.5x p50", f"{spread:.2f}x ({srv[32]['p99'] * 1e3:.1f} "
                         f"against {srv[32]['p50'] * 1e3:.1f} ms)", spread <= 2.5))
        out.append(_line("c=32 absolute >= 400 req/s", f"{srv[32]['rps']:.1f} req/s on "
                         f"{machine()}", srv[32]["rps"] >= 400))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
