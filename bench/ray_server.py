"""The same exported classifier behind Ray Serve, for ``bench/serve.py``'s comparison.

Ray Serve's documented way to serve a model with dynamic batching: one deployment whose
``__call__`` takes the HTTP request from Ray's proxy, parses and checks the body like the
naive servers of ``bench/serve.py`` (pydantic ``Payload`` schema, the model's contract),
and awaits a method decorated with ``@serve.batch``, which gets the payloads of up to
``max_batch_size`` concurrent requests (or what came within ``batch_wait_timeout_s``) as
one list: one onnxruntime forward over them, sorted by length (the same collation as
``cloud-api serve``), then one answer per request. ``max_ongoing_requests`` is raised
to 64: Ray's default (5) would cap every batch at 5. ``POST /tune`` sets the two batch
knobs of the running deployment (``python -m bench.serve --ray-tune`` sweeps them).

    python -m bench.ray_server --model DIR --port 8123 [--int8] [--threads 1]
        [--max-batch-size 16] [--batch-wait-timeout-s 0.002]

Runs until SIGTERM, then shuts Ray Serve and Ray down. Ray is in the ``bench`` extra only
(``pip install "ray[serve]"``), never a dependency of the service.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from bench.common import REPO


def build_app(model_dir: str, int8: bool, threads: int | None, max_batch_size: int,
              batch_wait_timeout_s: float):
    """The Ray Serve application (one replica)."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    @serve.deployment(num_replicas=1, max_ongoing_requests=max(64, 2 * max_batch_size),
                      ray_actor_options={"num_cpus": 1})
    class Classifier:
        def __init__(self):
            import orjson
            from pydantic import BaseModel
            from torch import nn  # noqa: F401  (ModelVersion's check imports it)

            from models.export.onnx_classifier import OnnxClassifier
            from models.versions.model_version import ModelVersion
            from shared.payload import Payload

            class Body(BaseModel):
                payloads: list[Payload]

            self.Body, self.orjson = Body, orjson
            self.clf = OnnxClassifier(model_dir, threads=threads, int8=int8)
            self.labels = list(self.clf.config["labels"])
            self.shell = ModelVersion(Path(model_dir), self.clf.config, {}, nn.Identity())

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def forward(self, payloads: list) -> list:
            import numpy as np

            from cloud_api.serving.payload_queue import payload_length
            from models.training.data import collate_payloads

            order = sorted(range(len(payloads)), key=lambda i: payload_length(payloads[i]))
            z = self.clf.logits(collate_payloads([payloads[i] for i in order],
                                                 self.clf.config, as_numpy=True))
            z = z - z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            out = [None] * len(payloads)
            for row, i in zip(p.tolist(), order, strict=True):
                out[i] = row
            return out

        async def __call__(self, request: Request):
            if request.method == "GET":  # /readyz of bench.common.start_server
                return JSONResponse({"status": "ok"})
            if request.url.path == "/tune":  # python -m bench.serve --ray-tune: batch settings
                knobs = await request.json()
                self.forward.set_max_batch_size(int(knobs["max_batch_size"]))
                self.forward.set_batch_wait_timeout_s(float(knobs["batch_wait_timeout_s"]))
                return JSONResponse(knobs)
            parsed = self.Body.model_validate_json(await request.body())
            preds = []
            for p in parsed.payloads:  # one payload per request in the benchmark
                self.shell.check_payload(p)
                row = await self.forward(p)
                best = max(range(len(row)), key=row.__getitem__)
                preds.append({"label": self.labels[best],
                              "scores": dict(zip(self.labels, row, strict=True))})
            return Response(self.orjson.dumps({"model_id": "bench", "version": "v1",
                                               "predictions": preds}),
                            media_type="application/json")

    return Classifier.bind()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--batch-wait-timeout-s", type=float, default=0.002)
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args()

    import ray
    from ray import serve

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    serve.start(http_options={"host": "127.0.0.1", "port": args.port},
                logging_config={"log_level": "WARNING", "enable_access_log": False})
    serve.run(build_app(args.model, args.int8, args.threads, args.max_batch_size,
                        args.batch_wait_timeout_s), route_prefix="/")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
