"""Setting up a privatize run from its options: the mechanism object, the check against a
served model, the length limit, the ``Privatizer``."""

from __future__ import annotations

import json

from edge_agent.errors import CliError, UsageError, warn
from edge_agent.privatize.options import MechanismOptions, PrivatizeOptions
from edge_agent.privatize.privatizer import Privatizer
from shared.floor import WeakPrivacyError
from shared.mechanisms import registry


def mechanism_for(m: MechanismOptions, bundle):
    """The shared.mechanisms object for the options, from the one factory
    (``shared.mechanisms.create``); ValueError names a bad parameter, UsageError a bundle
    without the encoder a vector mechanism needs."""
    cls = registry.get(m.name)
    secret = m.texthide_seed_value() if "texthide_key" in cls.edge_options else None
    try:
        return cls.from_params(m.params(), bundle, secret=secret)
    except registry.NoEncoder:
        raise UsageError(f"--mechanism {m.name} needs a bundle with the frozen sentence "
                         "encoder (encoder.onnx); this one has none: use --server or a bundle "
                         "made by `cloud-api export-bundle`") from None


def check_model(model: dict, name: str, mine: dict) -> None:
    """Refuse, before sending, a mechanism or parameters the served model does not read."""
    want, params = model.get("mechanism"), model.get("params")
    mismatch = want is not None and want != name
    if not mismatch and isinstance(params, dict):
        # the parameters a payload must share with its model (TextHide: m, not k), compared
        # as the server compares them (registry.same_param); an absent optional parameter
        # (a token policy's public_p) differs from a given one
        cls = registry.get(name)
        mismatch = bool(registry.differing_params(cls.compared_params(_given(mine)),
                                                  cls.compared_params(_given(params))))
    if mismatch:
        raise CliError(f"model {model.get('id')} reads {want} {json.dumps(params)}; this run "
                       f"would send {name} {json.dumps(mine)}: set the same mechanism and "
                       "parameters")


def _given(params: dict) -> dict:
    """``params`` without the optional ones left unset (None)."""
    return {k: v for k, v in params.items() if v is not None}


def max_length_for(opts: PrivatizeOptions, bundle, model: dict | None) -> int | None:
    """--max-length, else for --post predict the served model's own limit (a model trained
    at 128 refuses longer token payloads; the bundle allows up to 512), else the bundle's.
    Vector payloads have one size whatever the text's length: the encoder's limit applies."""
    given = opts.input.max_length

    if given is not None or model is None or opts.post.mode != "predict" \
            or not registry.get(opts.mechanism.name).payload_kind.reads_tokens:
        return given
    return bundle.length_for_model(model.get("max_length"))


def make_privatizer(opts: PrivatizeOptions, bundle, model: dict | None):
    """(mechanism object, Privatizer) for the options; UsageError for parameters that are
    invalid or weaker than the privacy floor (without --allow-weak-privacy)."""

    m = opts.mechanism
    try:
        mech = mechanism_for(m, bundle)
        priv = Privatizer(bundle, mech, max_length=max_length_for(opts, bundle, model),
                          truncate=opts.input.truncate,
                          float_dtype="float16" if m.float16 else "float32",
                          allow_weak_privacy=m.allow_weak_privacy,
                          trusted_bundles=opts.server.trusted_bundles)
    except WeakPrivacyError as exc:
        raise UsageError(f"{exc}; --allow-weak-privacy privatizes anyway") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if priv.weak_privacy:
        warn(f"{priv.weak_privacy}: the output is close to the raw text "
             "(--allow-weak-privacy)")
    return mech, priv
