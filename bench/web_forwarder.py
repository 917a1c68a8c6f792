"""The bytes a page downloads through the forwarder template, against the service directly.

    python -m bench.web_forwarder [--home DIR] [--table pca32-int8]

Serves a home's dχ-text model (``--home``, else a throwaway one with a quick model over the
packaged MiniLM's ``--table``, as ``bench.web_page`` makes it), starts the forwarder template
(``web_edge/examples/forwarder.mjs``, serving the built ``/demo`` page's files with
``staticFiles``), signs in, and fetches what a page fetches, as a browser asks for it
(``Accept-Encoding: gzip, deflate, br``): the bundle (direct, and through the forwarder), the
page's script and onnxruntime-web's WebAssembly, once, then again with the validators a browser
keeps (``If-None-Match``). Prints the bytes on the wire and the headers that decide caching.
Target (issue 44): the bundle through the forwarder compressed, <= 1.1 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import REPO, free_port, serve
from bench.web_page import quick_home
from shared.table import DEFAULT_TABLE, MATCHED_ETA

WEB_EDGE = REPO / "web_edge"
ASK = {"Accept-Encoding": "gzip, deflate, br"}


def _get(client: httpx.Client, url: str, headers: dict | None = None) -> tuple[httpx.Response, int]:
    """(the answer, its body's bytes as they came over the wire: not decoded)."""
    with client.stream("GET", url, headers=headers) as r:
        return r, sum(len(chunk) for chunk in r.iter_raw())


def _line(what: str, got: tuple[httpx.Response, int]) -> None:
    r, size = got
    h = r.headers
    print(f"  {what}: {r.status_code}, {size:,} B on the wire "
          f"({h.get('content-encoding') or 'identity'}); Cache-Control: {h.get('cache-control')}; "
          f"ETag: {h.get('etag')}; Last-Modified: {h.get('last-modified')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, help="a home serving a dchi-text model")
    ap.add_argument("--table", default=DEFAULT_TABLE, choices=sorted(MATCHED_ETA))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-forwarder-"))
    home = args.home or quick_home(tmp, None, args.table)
    proc, url, key = serve(home, tmp / "serve.log")
    port = free_port()
    login = os.urandom(8).hex()
    dist = WEB_EDGE / "demo" / "dist"
    fwd = subprocess.Popen(["node", str(WEB_EDGE / "examples" / "forwarder.mjs"), "--port", str(port),
                            "--static", str(dist)], cwd=WEB_EDGE,
                           env={**os.environ, "PRIVBERT_SERVICE": url, "PRIVBERT_API_KEY": key,
                                "APP_LOGIN_TOKEN": login},
                           stdout=(tmp / "forwarder.log").open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                httpx.get(base + "/", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        page = httpx.Client(base_url=base, timeout=300, headers=ASK)
        assert page.post("/login", content=json.dumps({"token": login})).status_code == 204
        models = page.get("/privbert/v1/models").json()["models"]
        model = next(m for m in models if m["mechanism"] == "dchi-text")
        bid = model["bundle_id"]
        service = httpx.Client(timeout=300, headers={**ASK, "Authorization": f"Bearer {key}"})
        direct = _get(service, f"{url}/v1/bundles/{bid}")
        print(f"model {model['id']}, bundle {bid[:12]}…, {int(direct[0].headers['x-bundle-bytes']):,} B "
              "before compression")
        _line("bundle from the service", direct)
        via = _get(page, f"/privbert/v1/bundles/{bid}")
        _line("bundle through the forwarder", via)
        target = via[1] <= 1_100_000 and via[0].headers.get("content-encoding") == "gzip"
        print(f"  target: compressed, <= 1,100,000 B: {'met' if target else 'NOT met'}")
        assets = sorted((dist / "assets").iterdir())
        names = [a.name for a in assets if a.suffix in (".js", ".wasm")]
        for name in ["", *names]:
            path = f"/assets/{name}" if name else "/"
            first = _get(page, path)
            _line(f"{path} first visit", first)
            if "immutable" in (first[0].headers.get("cache-control") or ""):
                print("    next visit: from the browser's cache, not asked for (immutable)")
                continue
            again = _get(page, path, {"If-None-Match": first[0].headers.get("etag") or ""})
            print(f"    next visit: revalidated, {again[0].status_code}, {again[1]:,} B body")
    finally:
        fwd.terminate()
        fwd.wait(10)
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
