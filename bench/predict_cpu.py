"""Where a predict's CPU goes outside the forward: the service's ASGI app driven in this
process (no HTTP server, no sockets), one request at a time or 32 at once, against the naive
app of ``bench/serve.py`` on the same model, payloads and requests, with the service's
hot-path changes (each made to bring a predict nearer the bare forward) switched off one at a
time:

* ``inline off``: a lone request's forward handed to the inference thread and back;
* ``python-json-logger``: the access line formatted by python-json-logger, as before;
* ``charge not committed``: attribution only, never a way to run the service: the
  prediction's privacy budget charge answered at once instead of by the charge writer's
  SQLite transaction (what the durable ledger costs a request).

Each variant's CPU per request (``getrusage``: every thread of this process) is the median
of ``--rounds`` turns of ``--requests`` requests, the variants taking turns, so the other
jobs of a shared machine weigh on all alike. CPU time, unlike wall time, hardly moves with
the machine's load.

    python -m bench.predict_cpu [--model DIR] [--concurrency 1 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from contextlib import AsyncExitStack
from pathlib import Path

from bench.common import REPO, machine, table
from bench.serve import API_KEY, MODEL_ID, naive_app, prepare, request_bodies


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def drive(app, bodies: list[bytes], n: int, concurrency: int) -> tuple[float, float]:
    """CPU seconds per request of ``n`` predict requests, ``concurrency`` at a time, and
    wall seconds per request (at concurrency 1: a request's mean latency)."""
    path = f"/v1/models/{MODEL_ID}/predict"

    class Cycle:  # a client that stays: the body, then http.disconnect once answered (ASGI)
        def __init__(self, body: bytes):
            self.body, self.sent, self.answered = body, False, asyncio.Event()

        async def receive(self):
            if not self.sent:
                self.sent = True
                return {"type": "http.request", "body": self.body, "more_body": False}
            await self.answered.wait()
            return {"type": "http.disconnect"}

    async def one(body: bytes) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
                 "client": ("127.0.0.1", 5000), "headers": [
                     (b"host", b"127.0.0.1:8000"),
                     (b"authorization", f"Bearer {API_KEY}".encode()),
                     (b"content-type", b"application/json"),
                     (b"content-length", str(len(body)).encode())]}
        status = []
        cycle = Cycle(body)

        async def send(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif not message.get("more_body", False):
                cycle.answered.set()

        await app(scope, cycle.receive, send)
        assert status == [200], status

    async def client(k: int) -> None:
        for i in range(k, n, concurrency):
            await one(bodies[i % len(bodies)])

    c0, t0 = cpu(), time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return (cpu() - c0) / n, (time.perf_counter() - t0) / n


class UncommittedCharges:
    """The ``charge not committed`` variant's stand-in for the charge writer (attribution
    only): every charge is answered at once, as if committed, without the database."""

    def submit(self, ch):
        from cloud_api.store import budgets

        fut = asyncio.get_running_loop().create_future()
        fut.set_result(budgets.Charged(0.0, None, ch.cost))
        return fut


def formatter(name: str):
    """The access log's formatter of variant ``name``: python-json-logger's (what the
    service used before its own, cheaper formatter) or the service's own."""
    from cloud_api import logs

    if name != "python-json-logger":
        return logs.json_formatter()
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", timestamp=False,
                         rename_fields={"asctime": "time", "levelname": "level",
                                        "name": "logger"}, datefmt=logs.DATEFMT)


async def main_async(args, model: Path, home: Path, bodies: list[bytes]) -> list[list]:
    import logging

    from cloud_api import logs
    from cloud_api.app import create_app
    from cloud_api.settings import Settings

    names = ["cloud-api serve", "inline off", "python-json-logger",
             "charge not committed", "naive (serial)"]
    try:
        import pythonjsonlogger  # noqa: F401  (no longer a dependency of the service)
    except ImportError:
        names.remove("python-json-logger")
    logs.configure("INFO", True)  # the service's access log (INFO), written to /dev/null
    handler = logging.getLogger().handlers[0]
    sink = open(os.devnull, "w")  # noqa: SIM115 (closed below)
    handler.setStream(sink)
    apps = {}
    async with AsyncExitStack() as stack:
        stack.callback(sink.close)
        for name in names:
            if name.startswith("naive"):
                apps[name] = naive_app(str(model), args.backend, "serial", args.threads)
                continue
            app = create_app(Settings(
                home=home, api_keys=API_KEY, admin_keys=API_KEY + "-admin",
                backend=args.backend, torch_threads=args.threads, worker_in_serve=False,
                rate_limit_per_key=0, inline_when_idle=name != "inline off"))
            await stack.enter_async_context(app.router.lifespan_context(app))
            if name == "charge not committed":
                app.state.charges = UncommittedCharges()
            apps[name] = app
        rows = []
        for c in args.concurrency:
            got: dict[str, list[float]] = {n: [] for n in names}
            wall: dict[str, list[float]] = {n: [] for n in names}
            for name in names:  # warm-up
                handler.setFormatter(formatter(name))
                await drive(apps[name], bodies, 32, c)
            for rnd in range(args.rounds):
                for name in names[rnd % len(names):] + names[: rnd % len(names)]:
                    handler.setFormatter(formatter(name))
                    c_s, w_s = await drive(apps[name], bodies, args.requests, c)
                    got[name].append(c_s)
                    wall[name].append(w_s)
            base = statistics.median(got["naive (serial)"])
            wbase = statistics.median(wall["naive (serial)"])
            for name in names:
                med, wmed = statistics.median(got[name]), statistics.median(wall[name])
                rows.append([c, name, f"{med * 1e3:.3f}", f"{(med - base) * 1e3:+.3f}",
                             f"{wmed * 1e3:.3f}", f"{(wmed - wbase) * 1e3:+.3f}"])
                print(f"  c={c:<3d} {name:20s} {med * 1e3:7.3f} CPU ms/request "
                      f"({(med - base) * 1e3:+.3f} against naive serial), wall "
                      f"{wmed * 1e3:7.3f} ms/request ({(wmed - wbase) * 1e3:+.3f}) load "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=REPO / "var" / "bench" / "serve")
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--backend", default="onnx-int8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--requests", type=int, default=200, help="requests per turn")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(f"machine: {machine()}", flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; backend {args.backend}, "
          f"threads {args.threads}", flush=True)
    model, home = prepare(args.work, args.rows, args.model)
    bodies = request_bodies(512, model)
    rows = asyncio.run(main_async(args, model, home, bodies))
    print()
    print(table(["conc.", "app", "CPU ms/request", "vs naive serial", "wall ms/request",
                 "vs naive serial"], rows))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
