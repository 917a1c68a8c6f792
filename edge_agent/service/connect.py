"""The service client and the edge bundle of a run: from a directory, a server, or the
default model (``ServerOptions``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from edge_agent.errors import CliError, UsageError, info
from edge_agent.service.bundle_cache import bundle_for_model, cache_root
from edge_agent.service.known_bundles import check_vouched
from edge_agent.service.pins import Pins, check_pin
from shared.bundle import EdgeBundle
from shared.conventions import PINS_FILE


@dataclass(frozen=True)
class ServerOptions:
    """Where the bundle comes from, and the service to talk to."""

    bundle: str | None = None  # a bundle directory or a Hugging Face BERT folder
    server: str | None = None
    model: str | None = None
    api_key: str | None = None
    timeout: float = 30.0
    retries: int = 5
    accept_bundle: frozenset[str] = frozenset()  # ids the user accepts in place of a pin
    trusted_bundles: frozenset[str] = frozenset()  # trusted as they are, beside the known ones
    refuse_unverified: bool = False  # refuse a bundle neither known nor trusted


def make_client(opts: ServerOptions, batch_size: int = 64):
    """A ``PrivbertClient`` for ``opts.server``; UsageError for bad timeouts or URL."""
    # lazy: httpx, only when posting
    from edge_agent.service.client import PrivbertClient

    if opts.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {opts.timeout}")
    if opts.retries < 0:
        raise UsageError(f"--retries must be >= 0, got {opts.retries}")
    try:
        return PrivbertClient(cast(str, opts.server), opts.api_key, timeout=opts.timeout,
                              retries=opts.retries, batch_size=batch_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def resolve_bundle(opts: ServerOptions, client=None,
                   check_model: Callable[[dict], None] | None = None,
                   check_bundle: Callable[[object, dict | None], None] | None = None):
    """(bundle, served model description or None); ``check_model(model)`` runs before any
    bundle is fetched, ``check_bundle(bundle, model)`` (the privacy floors) once it is
    verified and before it is pinned: a bundle the device refuses is never pinned."""
    from pathlib import Path

    model = None
    if opts.server:

        client = client or make_client(opts)
        model = client.model(opts.model)
        if check_model is not None:
            check_model(model)
        if not opts.bundle:
            if isinstance(model.get("bundle_id"), str):  # before a byte of it is fetched
                check_vouched(model["bundle_id"], opts.trusted_bundles, opts.refuse_unverified)
            _check_pin(opts, model, record=False, served=client.served_ids)
            bundle, model, path, fetched = bundle_for_model(client, model=model)
            if check_bundle is not None:
                check_bundle(bundle, model)
            _check_pin(opts, model, record=True, served=client.served_ids)  # accepted
            info(f"bundle {bundle.bundle_id[:12]}… of model {model.get('id')} "
                 f"{'fetched and cached in' if fetched else 'from cache'} {path}")
            return bundle, model
    elif opts.model:
        raise UsageError("--model needs --server")
    if opts.bundle:
        path = Path(opts.bundle)
        if not path.exists():
            raise CliError(f"{path}: no such bundle directory")
        if not path.is_dir():
            raise CliError(f"{path}: not a directory (--bundle takes a bundle directory)")
        if (path / "bundle.json").is_file():
            bundle = EdgeBundle.load(path)
        else:
            bundle = EdgeBundle.from_model(path)
    else:
        bundle = EdgeBundle.from_model()
    check_vouched(bundle.bundle_id, opts.trusted_bundles, opts.refuse_unverified)
    if model is not None and model.get("bundle_id") not in (None, bundle.bundle_id):
        raise CliError(f"--bundle {opts.bundle} is {bundle.bundle_id[:12]}…, but model "
                       f"{model.get('id')} expects bundle {str(model['bundle_id'])[:12]}…; "
                       "drop --bundle to fetch the right one")
    if check_bundle is not None:
        check_bundle(bundle, model)
    return bundle, model


def _check_pin(opts: ServerOptions, model: dict, record: bool, served=None) -> None:
    """The served model's bundle id against this device's pin (``edge_agent.service.pins``)."""

    bundle_id, model_id = model.get("bundle_id"), str(model.get("id"))
    if not isinstance(bundle_id, str):
        return  # bundle_for_model refuses it in its own words
    what = check_pin(Pins(cache_root() / PINS_FILE), str(opts.server), model_id, bundle_id,
                     accept=opts.accept_bundle, trusted=opts.trusted_bundles, record=record,
                     served=served)
    if not record:
        return
    if what == "pinned":
        info(f"bundle {bundle_id[:12]}… pinned for model {model_id}: this device will refuse "
             "another one from this server unless accepted with --accept-bundle")
    elif what == "accepted":
        info(f"bundle {bundle_id[:12]}… accepted for model {model_id} (--accept-bundle)")
