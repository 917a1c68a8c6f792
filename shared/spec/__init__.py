"""The mechanism spec: what every edge must agree on, generated from the Python registry.

``shared/spec/mechanisms.json`` (committed; ``python -m shared.spec`` writes it, a test fails
when it differs from what the registry generates) holds, language-neutrally:

* each registered mechanism: its name, the JSON Schema of its ``Params`` (pydantic's, the
  same the server's OpenAPI shows), its payload (kind, array field, dtypes, dimensions),
  budget family, whether it is private and has an ε, the parameters a payload shares with
  its model, those predictions override, its edge options and its command-line flags
  (type, choices, default, help, the edge's default);
* the budget families (ε or not, the dχ metric, the memo rule);
* the constants of the privacy floor (``shared.floor``), of the computability check and of
  the int8 candidate pass (``shared.mechanisms.int8_pass``), the parameter tolerance, the
  bundle format (files, hashed fields, a table's .npy dtypes);
* the device's conventions (``shared.conventions``): the ledger's day and clock anchors, the
  cache's and pins' names, how an ε is written;
* the token policies (``shared.policy``): the reference of public words an edge accepts in a
  bundle's list, the named lists, the default p, the continuation prefix;
* the bundles privbert builds from public sources (``shared.trust``) and the text floor's
  constants with the digest of its public sample (``shared.floor_text``; the sample itself
  goes to ``web_edge/src/generated/public_text.ts``);
* the refusal templates both edges word identically (``shared.messages``);
* ``spec_version``, raised when the meaning of a field changes.

The web edge reads the TypeScript module generated from it
(``web_edge/src/generated/spec.ts``, ``shared.spec.typescript``); the Python command lines
derive their mechanism flags from it (``edge_agent.cli_spec``). Built-in mechanisms only: a
plugin's entry is made the same way, at run time (:func:`mechanism_entry`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import shared.mechanisms  # noqa: F401 (registers the built-in mechanisms)
from shared import conventions, floor, floor_text, ledger, messages, policy, trust
from shared.bundle import (
    EMBEDDINGS_FILE,
    ENCODER_FILE,
    FORMAT,
    FORMAT_VERSION,
    HASHED_IF_PRESENT,
    HASHED_META,
    META_FILE,
    NPY_DTYPES,
    TABLE_FILE,
    TABLE_SCALE_FILE,
    TOKENIZER_FILE,
)
from shared.ledger import budget_family
from shared.mechanisms import computable, int8_pass, registry
from shared.payload import PAYLOAD_CLASSES

SPEC_VERSION = 1
SPEC_FILE = Path(__file__).resolve().with_name("mechanisms.json")
GENERATOR = "python -m shared.spec"


def _flag(cls: Any, name: str, schema: dict[str, Any], required: bool) -> dict[str, Any]:
    """The command-line flag of parameter ``name`` of mechanism class ``cls``."""
    prop = schema.get("properties", {}).get(name, {})
    if "type" not in prop and "anyOf" in prop:  # an optional parameter: X | None
        given = [t for t in prop["anyOf"] if t.get("type") != "null"]
        if len(given) == 1:
            prop = {**given[0], **{k: v for k, v in prop.items() if k != "anyOf"}}
    kind = prop.get("type", "string")
    out = {"param": name, "flag": "--" + name.replace("_", "-"), "type": kind,
           "choices": list(prop["enum"]) if "enum" in prop else None,
           "required": required, "default": prop.get("default"),
           "help": cls.param_help.get(name) or name.replace("_", " "),
           "metavar": cls.param_metavar.get(name),
           "edge_default": cls.edge_defaults.get(name)}
    if kind not in ("number", "integer", "string"):
        raise ValueError(f"mechanism {cls.name}: parameter {name} of JSON type {kind!r} "
                         "cannot be a command-line flag (list it in fixed_params)")
    return out


def mechanism_entry(cls: Any) -> dict[str, Any]:
    """What the spec says about one mechanism class (a plugin's too)."""

    schema = cls.Params.model_json_schema()
    names = list(cls.param_names())
    required = set(cls.required_params())
    payload = PAYLOAD_CLASSES[cls.name]
    return {
        "name": cls.name,
        "family": cls.family,
        "private": bool(cls.private),
        "has_epsilon": bool(cls.has_epsilon),
        "memo": budget_family(cls.family).memo,
        "payload": {"kind": cls.payload_kind.value, "classifier": cls.payload_kind.classifier,
                    "reads_tokens": cls.payload_kind.reads_tokens,
                    "field": payload.array_field, "dtypes": list(payload.array_dtypes),
                    "ndim": payload.array_ndim},
        "substitutes_tokens": registry.substitutes_tokens(cls),
        "params": schema,
        "param_names": names,
        "required_params": [n for n in names if n in required],
        "fixed_params": sorted(cls.fixed_params),
        "compared_params": sorted(cls.compared_params(dict.fromkeys(names))),
        "prediction_params": dict(cls.prediction_params({})),
        "edge_options": sorted(cls.edge_options),
        "flags": [_flag(cls, n, schema, n in required) for n in names
                  if n not in cls.fixed_params],
    }


def build() -> dict[str, Any]:
    """The spec of the built-in mechanisms, as the registry, the floor and the ledger say
    today (no plugin: the committed file must not depend on what is installed)."""

    built_in = [c for c in registry.mechanisms()
                if c.__module__.startswith("shared.mechanisms.")]
    return {
        "spec_version": SPEC_VERSION,
        "generated_by": GENERATOR,
        "mechanisms": [mechanism_entry(c) for c in built_in],
        "families": [{"name": f.name, "epsilon": f.epsilon, "metric": f.metric,
                      "memo": f.memo} for f in ledger.families()],
        "floor": {k: getattr(floor, k) for k in (
            "THRESHOLD", "FLOOR_TOKENS", "MEASURE_FIRST", "MEASURE_BATCH", "MEASURE_MAX", "MEASURE_Z",
            "NEAR_DUPLICATE", "DUPLICATE_SAMPLE", "DIRECTIONS", "LAPLACE_STEP",
            "SHARED_DIRECTIONS_ABOVE", "ESTIMATE_TOKENS", "ESTIMATE_RTOL")},
        "computable": {"TAIL": computable.TAIL, "F32_MAX": computable.F32_MAX,
                       "F16_MAX": computable.F16_MAX},
        "int8_pass": {k: getattr(int8_pass, k) for k in (
            "MAX_DIM", "U", "GAMMA4", "SLACK", "TINY", "BLOCK", "PAD_BIAS")},
        "param_rtol": registry.PARAM_RTOL,
        "bundle": {"format": FORMAT, "format_version": FORMAT_VERSION,
                   "hashed_meta": list(HASHED_META), "hashed_if_present": list(HASHED_IF_PRESENT),
                   "files": {"tokenizer": TOKENIZER_FILE, "embeddings": EMBEDDINGS_FILE,
                             "encoder": ENCODER_FILE, "meta": META_FILE, "table": TABLE_FILE,
                             "table_scale": TABLE_SCALE_FILE},
                   "npy_dtypes": dict(NPY_DTYPES)},
        "device": conventions.spec_section(),
        "policy": {"reference": sorted(policy.REFERENCE), "lists": {
            k: list(v) for k, v in policy.POLICIES.items()}, "none": policy.NO_POLICY,
            "default_p": policy.DEFAULT_P, "continuation_prefix": policy.CONTINUATION_PREFIX,
            "source": policy.SOURCE, "rare_from": policy.RARE_FROM},
        "known_bundles": trust.spec_section(),
        "text_floor": floor_text.spec_section(),
        "messages": {
            "format": "Python str.format fields: {name}; {name:g} is %g (6 significant "
                      "digits); {name:.3g}; {name:,} an integer with thousands commas. A share "
                      "p is written '100%' at 1, else 100 p with two decimals and '%'.",
            "templates": messages.templates()},
    }


def dumps(spec: dict[str, Any]) -> str:
    """The committed file's text for ``spec``: sorted keys, two-space indents."""
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def load() -> dict[str, Any]:
    """The committed spec (``shared/spec/mechanisms.json``)."""
    spec: dict[str, Any] = json.loads(SPEC_FILE.read_text(encoding="utf-8"))
    return spec
