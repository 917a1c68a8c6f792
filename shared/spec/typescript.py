"""``web_edge/src/generated/spec.ts``: the mechanism spec as a TypeScript module.

The web edge imports its constants, families, refusal templates and each mechanism's
parameters from here instead of keeping copies (issue 36). The module is the spec's JSON as
a ``const`` literal (so TypeScript knows every name and number exactly) and a few named
views of it.
"""

from __future__ import annotations

import json

HEADER = """\
// The mechanism spec (shared/spec/mechanisms.json), generated from the Python registry by
// `python -m shared.spec`; do not edit by hand (tests/shared/test_spec.py fails when this
// file differs from what the generator writes).
"""


def render(spec: dict) -> str:
    body = json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False)
    return (HEADER + "\n"
            f"export const SPEC = {body} as const;\n\n"
            "export const SPEC_VERSION = SPEC.spec_version;\n"
            "export const FLOOR = SPEC.floor;\n"
            "export const COMPUTABLE = SPEC.computable;\n"
            "export const INT8_PASS = SPEC.int8_pass;\n"
            "export const PARAM_RTOL = SPEC.param_rtol;\n"
            "export const BUNDLE_FORMAT = SPEC.bundle;\n"
            "export const DEVICE = SPEC.device;\n"
            "export const FAMILIES = SPEC.families;\n"
            "export const MESSAGES = SPEC.messages.templates;\n"
            "export const MECHANISMS = SPEC.mechanisms;\n"
            "export const POLICY = SPEC.policy;\n\n"
            "export type MechanismSpec = (typeof MECHANISMS)[number];\n"
            "export type MechanismName = MechanismSpec[\"name\"];\n"
            "export type FamilyName = (typeof FAMILIES)[number][\"name\"];\n"
            "export type MessageName = keyof typeof MESSAGES;\n")
