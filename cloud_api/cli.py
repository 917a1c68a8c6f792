"""`cloud-api` command line. Each subcommand lives next to the code it drives and
registers itself here with ``register(subparsers)``; heavy imports happen only when
a subcommand runs. Each command parses its flags once, at its entry (``guarded``), into a
frozen dataclass of typed options (``models.cli.options``); the code below takes that or
plain values, never the namespace.

    cloud-api serve [--host 127.0.0.1] [--port 8000] [--workers 1] [--home DIR]
    cloud-api models list | promote MODEL VERSION | verify [MODEL [VERSION]]
              | register DIR --model-id ID [--promote]
    cloud-api bootstrap --data TRAIN.tsv ...        (cloud_api/bootstrap.py)
    cloud-api train | evaluate | export-bundle | pretrain   (models/)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cloud_api import logs
from cloud_api.errors import InvalidRequest, ServiceError
from cloud_api.home import ModelHome
from cloud_api.serving.bundles import BundleStore
from cloud_api.settings import Settings, settings_error
from cloud_api.store.db import Database
from cloud_api.store.seals import DatabaseSeals
from cloud_api.store.stored_home import open_home
from models.cli.options import entry, parsed
from models.versions.version_folder import BUNDLE_DIR, INT8_FILE, ONNX_FILE, read_config
from shared.bundle import BundleError, EdgeBundle

PROG = "cloud-api"

# subcommand modules, each with register(subparsers) -> None
_COMMANDS = [
    "models.cli.train",      # train, evaluate, export-bundle
    "models.cli.pretrain",   # pretrain
    "cloud_api.bootstrap",   # bootstrap
    "cloud_api.cli_db",      # db upgrade | current (the record store's schema)
    "cloud_api.cli_store",   # store import-home | list | sync (the shared model store)
    "cloud_api.jobs.cli",    # worker
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="privbert server side")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_serve(sub)
    register_models(sub)
    for name in _COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


OptionsT = TypeVar("OptionsT")


def fail(message: str) -> int:
    """One line ``cloud-api: error: ...`` on stderr; exit code 2."""
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def _failed(exc: BaseException) -> int:
    return fail(exc.detail if isinstance(exc, ServiceError) else str(exc) or type(exc).__name__)


def guarded(fn: Callable[[OptionsT], int], parse: Callable[[argparse.Namespace], OptionsT]
            ) -> Callable[[argparse.Namespace], int]:
    """A command's entry (``models.cli.options.entry``): expected failures (bad flags, a
    missing folder, an unusable bundle, a refused change) as one line, exit 2."""
    return entry(fn, parse, (ServiceError, ValueError, OSError, BundleError, KeyError), _failed)


def home_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", metavar="DIR", help="the model home: model versions, bundles, "
                   "jobs (default $PRIVBERT_HOME, else ./var)")


def settings_for(home: str | None) -> Settings:
    """Settings from the environment with ``--home`` applied (also exported, so that uvicorn
    worker processes see it)."""
    if home:
        os.environ["PRIVBERT_HOME"] = str(home)

    try:
        return Settings()
    except ValueError as exc:  # pydantic's ValidationError: one line naming the variables
        raise ValueError(settings_error(exc)) from None


# -- serve -----------------------------------------------------------------------------------
# prometheus-client's multiprocess switch (cloud_api.metrics.MULTIPROC_ENV) and its old name;
# spelled here so that the parent of N uvicorn processes never imports prometheus_client
MULTIPROC_ENVS = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")
SERVE_HELP = """Run the HTTP service with uvicorn. Every knob is a PRIVBERT_* environment
variable (cloud_api/settings.py): keys (PRIVBERT_API_KEYS, PRIVBERT_ADMIN_KEYS or
PRIVBERT_KEYS_FILE), limits, batching, backend, device. SIGTERM or Ctrl-C: stop accepting,
finish the requests in flight and drain the batch queues, then exit.

--workers N > 1 starts N uvicorn processes sharing the port (not to be confused with
PRIVBERT_INFERENCE_WORKERS, the inference replicas of each model inside a process, nor with
the job worker, `cloud-api worker`). Each process loads every promoted model and has its own
batch queues, its own concurrency limit (PRIVBERT_MAX_CONCURRENT_REQUESTS) and per-key rate
limit (PRIVBERT_RATE_LIMIT_PER_KEY): a key may get up to N times its rate across the
processes. Privacy budgets are kept in the database and hold across processes and server
instances. Each process also runs its own job worker thread (with
PRIVBERT_WORKER_IN_SERVE=1; prefer 0 and separate `cloud-api worker` processes). /metrics
shows the whole server whichever process answers (prometheus-client's multiprocess mode, in
a private directory made at start and removed at exit). Several server instances behind a
load balancer: docs/serving.md, "Several uvicorn processes and server instances"."""


@dataclass(frozen=True)
class ServeOptions:
    """``cloud-api serve``: what its flags say (None: from the environment)."""

    host: str | None
    port: int | None
    workers: int
    graceful_timeout: int
    home: str | None


def register_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the HTTP service (uvicorn)", description=SERVE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", help="address to bind (default $PRIVBERT_HOST, else 127.0.0.1; "
                   "0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, help="port (default $PRIVBERT_PORT, else 8000; the "
                   "serve image's HEALTHCHECK asks $PRIVBERT_PORT)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn processes (1); "
                   "see above for what N > 1 means")
    p.add_argument("--graceful-timeout", type=int, default=30, metavar="S",
                   help="seconds to finish requests in flight at shutdown (30)")
    home_arg(p)
    p.set_defaults(func=guarded(run_serve, parsed(ServeOptions)))


def run_serve(o: ServeOptions) -> int:
    if o.workers < 1:
        return fail(f"--workers must be >= 1, got {o.workers}")
    host = o.host if o.host is not None else os.environ.get("PRIVBERT_HOST") or "127.0.0.1"
    port = o.port
    if port is None:
        env = os.environ.get("PRIVBERT_PORT") or "8000"
        try:
            port = int(env)
        except ValueError:
            return fail(f"PRIVBERT_PORT must be a port number, got {env!r}")
    if not 0 <= port <= 65535:
        return fail(f"--port must be in [0, 65535], got {port}")
    settings = settings_for(o.home)
    # lazy: fastapi, only for serve (`cloud-api worker` loads no web framework)
    from cloud_api.app import create_app
    from cloud_api.auth import KeyRing
    from cloud_api.routes.web import check_demo

    KeyRing.from_settings(settings)  # refuse to start without keys: ValueError, one line

    check_demo(settings)  # PRIVBERT_DEMO=1 without a built page: ValueError, one line
    import uvicorn

    common: dict[str, Any] = dict(
        host=host, port=port, access_log=False, server_header=False,
        log_config=logs.logging_config(settings.log_level, settings.log_json),
        timeout_graceful_shutdown=o.graceful_timeout, lifespan="on")
    with multiprocess_metrics(o.workers):
        if o.workers == 1:

            logs.configure(settings.log_level, settings.log_json)
            uvicorn.run(create_app(settings), **common)
        else:
            uvicorn.run("cloud_api.app:create_app_from_env", factory=True,
                        workers=o.workers, **common)
    return 0


@contextlib.contextmanager
def multiprocess_metrics(workers: int) -> Iterator[str | None]:
    """For N > 1 uvicorn processes: a fresh private directory (mode 0700, so no stale file
    of an earlier run, and nobody else's) named in PROMETHEUS_MULTIPROC_DIR for the processes to
    inherit (cloud_api/metrics.py), removed with everything in it at exit. An inherited
    value is never used: with one process the variable is dropped (the default registry
    serves), with N it is replaced. Runs before this process imports prometheus_client,
    which picks its mode from the variable once, at import."""
    for name in MULTIPROC_ENVS:
        os.environ.pop(name, None)
    if workers == 1:
        yield None
        return
    path = tempfile.mkdtemp(prefix="privbert-metrics-")
    os.environ[MULTIPROC_ENVS[0]] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENVS[0], None)
        shutil.rmtree(path, ignore_errors=True)


# -- models ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ListOptions:
    """``cloud-api models list``."""

    home: str | None
    json: bool


@dataclass(frozen=True)
class VersionOptions:
    """``cloud-api models promote | reseal MODEL VERSION``."""

    home: str | None
    model_id: str
    version: str


@dataclass(frozen=True)
class VerifyOptions:
    """``cloud-api models verify [MODEL [VERSION]]`` (None: every one)."""

    home: str | None
    model_id: str | None
    version: str | None


@dataclass(frozen=True)
class RegisterOptions:
    """``cloud-api models register DIR``."""

    home: str | None
    dir: str
    model_id: str
    promote: bool
    bundle: str | None


def register_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list, promote or register model versions in the home",
                       description="Operate the model versions in $PRIVBERT_HOME. A running "
                       "server picks up a promotion within PRIVBERT_RELOAD_INTERVAL_S.")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    ls = msub.add_parser("list", help="models, versions, the promoted one, dev accuracy")
    ls.add_argument("--json", action="store_true", help="one JSON document")
    home_arg(ls)
    ls.set_defaults(func=guarded(run_models_list, parsed(ListOptions)))
    pr = msub.add_parser("promote", help="serve VERSION of MODEL (atomic pointer switch)")
    pr.add_argument("model_id", metavar="MODEL")
    pr.add_argument("version", metavar="VERSION", help="e.g. v2")
    home_arg(pr)
    pr.set_defaults(func=guarded(run_models_promote, parsed(VersionOptions)))
    vf = msub.add_parser("verify", help="check versions whole against their manifest.json; "
                         "seal those from before manifests (exit 1 if one is not whole)")
    vf.add_argument("model_id", metavar="MODEL", nargs="?", help="default: every model")
    vf.add_argument("version", metavar="VERSION", nargs="?", help="default: every version")
    home_arg(vf)
    vf.set_defaults(func=guarded(run_models_verify, parsed(VerifyOptions)))
    rs = msub.add_parser("reseal", help="seal VERSION of MODEL as it is now, on purpose (after "
                         "an intended change): every array checked finite, a new manifest.json, "
                         "its digest recorded; prints what it sealed")
    rs.add_argument("model_id", metavar="MODEL")
    rs.add_argument("version", metavar="VERSION", help="e.g. v2")
    home_arg(rs)
    rs.set_defaults(func=guarded(run_models_reseal, parsed(VersionOptions)))
    rg = msub.add_parser("register", help="copy a version folder made by `cloud-api train` "
                         "into the home as the next version")
    rg.add_argument("dir", metavar="DIR", help="model version folder (cloud-api train --out)")
    rg.add_argument("--model-id", required=True, metavar="ID", help="model to add it to")
    rg.add_argument("--promote", action="store_true", help="promote it at once")
    rg.add_argument("--bundle", metavar="DIR", help="also add the edge bundle it was trained "
                    "with (needed unless it is the default MiniLM bundle or already there)")
    home_arg(rg)
    rg.set_defaults(func=guarded(run_models_register, parsed(RegisterOptions)))


def _home(home_dir: str | None) -> ModelHome:
    """The home of the settings: the shared store (PRIVBERT_MODEL_STORE=database, whose
    versions carry their manifests' digests), or on disk with the database's seal records
    when the database can be opened (the digests of sealed manifests, issue 42); else
    without them, said in one line."""

    s = settings_for(home_dir)
    if s.model_store == "database":
        return open_home(s)
    home = ModelHome(s.home)
    try:
        db = Database.from_settings(s)
        db.prepare()
    except Exception as exc:  # noqa: BLE001 (an unreachable or older database: said, not fatal)
        print(f"cloud-api: warning: the database cannot be opened ({exc}); the versions' "
              "manifests are checked without their seal records", file=sys.stderr)
        return home
    home.seals = DatabaseSeals(db)
    return home


def run_models_list(o: ListOptions) -> int:
    home = _home(o.home)
    out: list[dict[str, Any]] = []
    for model_id in home.model_ids():
        promoted = home.promoted(model_id)
        versions: list[dict[str, Any]] = []
        for v in home.versions(model_id):
            try:
                cfg = home.read_config(model_id, v)
            except (ValueError, OSError):
                cfg = {}
            metrics = _read_json(home.version_dir(model_id, v) / "metrics.json")
            versions.append({"version": v, "promoted": v == promoted,
                             "mechanism": cfg.get("mechanism"), "params": cfg.get("params"),
                             "bundle_id": cfg.get("bundle_id"), "labels": cfg.get("labels"),
                             "dev_accuracy": (metrics.get("dev") or {}).get("accuracy")})
        out.append({"id": model_id, "promoted": promoted, "versions": versions})
    if o.json:
        print(json.dumps({"home": str(home.root), "models": out}, indent=2))
        return 0
    if not out:
        print(f"no models in {home.root} (cloud-api bootstrap or models register)")
    for m in out:
        print(f"{m['id']}  promoted={m['promoted'] or '-'}")
        for v in m["versions"]:
            acc = v["dev_accuracy"]
            print(f"  {'*' if v['promoted'] else ' '} {v['version']}  {v['mechanism']} "
                  f"{json.dumps(v['params'], sort_keys=True)}  "
                  f"bundle={(v['bundle_id'] or '?')[:12]}  "
                  f"dev_accuracy={'-' if acc is None else f'{acc:.4f}'}")
    return 0


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_models_promote(o: VersionOptions) -> int:
    home = _home(o.home)
    before = home.promoted(o.model_id)
    home.promote(o.model_id, o.version)
    print(f"promoted {o.model_id} {o.version} (was {before or 'none'})")
    return 0


def run_models_verify(o: VerifyOptions) -> int:
    """One line per version: ``ok``, ``sealed`` (no manifest before: verified and written)
    or ``NOT WHOLE: why``; exit 1 when a version is not whole."""
    home = _home(o.home)
    models = [o.model_id] if o.model_id else home.model_ids()
    bad = 0
    for model_id in models:
        versions = [o.version] if o.version else home.versions(model_id)
        for v in versions:
            try:
                verified = home.verify(model_id, v)
            except InvalidRequest as exc:
                bad += 1
                print(f"{model_id} {v} NOT WHOLE: {exc.detail}")
                continue
            print(f"{model_id} {v} {'ok' if verified.sealed else 'sealed'}")
    return 1 if bad else 0


def run_models_reseal(o: VersionOptions) -> int:
    """Seal a version on purpose; one line per file sealed, then the manifest's digest."""
    home = _home(o.home)
    verified, digest = home.reseal(o.model_id, o.version)
    for name, sha in sorted(verified.digests.items()):
        print(f"  {sha}  {name}")
    where = "recorded in the database" if home.seals is not None else "NOT recorded (no database)"
    print(f"resealed {o.model_id} {o.version}: {len(verified.digests)} files as they are "
          f"now; manifest.json {digest}, {where}")
    return 0


def run_models_register(o: RegisterOptions) -> int:
    home = _home(o.home)
    cfg = read_config(o.dir)

    bundle_dir = o.bundle
    if not bundle_dir and (Path(o.dir) / BUNDLE_DIR / "bundle.json").is_file():
        bundle_dir = str(Path(o.dir) / BUNDLE_DIR)  # the bundle the version carries
    if bundle_dir:

        bundle = EdgeBundle.load(bundle_dir)
        if bundle.bundle_id != cfg["bundle_id"]:
            return fail(f"--bundle is {bundle.bundle_id[:12]}…, the model was trained with "
                        f"{cfg['bundle_id'][:12]}…")
        BundleStore(home).add(bundle)
    version = home.register(o.model_id, o.dir, prepare=_int8_for_register)
    print(f"registered {o.model_id} {version} ({cfg['mechanism']} "
          f"{json.dumps(cfg['params'], sort_keys=True)})")
    if o.promote:
        home.promote(o.model_id, version)
        print(f"promoted {o.model_id} {version}")
    if not bundle_dir:

        if not BundleStore(home).has(cfg["bundle_id"]):
            print(f"{PROG}: warning: bundle {cfg['bundle_id'][:12]}… is not in the home: add "
                  "it with --bundle DIR, or the server cannot serve this model",
                  file=sys.stderr)
    return 0


def _int8_for_register(folder: Path) -> None:
    """Quantize the version's classifier.onnx (onnx-int8 backend) unless its int8 file is
    current; without the quantizer (the serve image has no ``onnx``), say so and go on."""
    if not (folder / ONNX_FILE).is_file():
        return
    try:
        # lazy: onnx, only to build int8 (the serve image has none)
        from models.export.quantize import has_current_int8, quantize_classifier
    except ImportError as exc:
        print(f"{PROG}: warning: {INT8_FILE} not built ({exc.name} is not installed: the "
              "train extra has it); PRIVBERT_BACKEND=onnx-int8 will not find it",
              file=sys.stderr)
        return
    if not has_current_int8(folder):
        quantize_classifier(folder)
        print(f"quantized {ONNX_FILE} into {INT8_FILE}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
