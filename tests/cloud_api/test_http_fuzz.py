"""Requests generated from the server's own OpenAPI document with schemathesis, valid and
malformed (its negative mode), sent to a real `cloud-api serve` with an admin key: none is
answered 5xx, and every error is problem+json.

Bounded: ``MAX_EXAMPLES`` cases per operation and mode. ``model_id`` is pinned to a served
model, so that predict bodies reach the payload parsing instead of a 404. (schemathesis'
``pytest.from_fixture`` does not run under pytest 9, so each operation's Hypothesis strategy
is driven here directly.)"""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

MAX_EXAMPLES = 15


@pytest.fixture(scope="module")
def api_schema(server):
    config = SchemathesisConfig(seed=20260501)
    config.projects.default.update(base_url=server.url, request_timeout=30,
                                   headers=server.headers(server.admin_key),
                                   parameters={"model_id": "text"})
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json", config=config)


def _fuzz(op, mode: GenerationMode, counts: dict[int, int]) -> None:
    """``MAX_EXAMPLES`` generated requests of one operation; counts their statuses."""

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), derandomize=True)
    def check(case) -> None:
        r = case.call()
        counts[r.status_code] = counts.get(r.status_code, 0) + 1
        assert r.status_code < 500, (case.method, case.path, r.status_code, r.text)
        if r.status_code >= 400:
            ctype = r.headers["content-type"][0]
            assert ctype.startswith("application/problem+json"), (r.status_code, ctype)

    try:
        check()
    except hypothesis.errors.Unsatisfiable:  # nothing to make malformed (no input at all)
        assert mode is GenerationMode.NEGATIVE


def test_no_generated_request_gets_a_5xx(api_schema):
    seen: dict[tuple[str, str], dict[int, int]] = {}
    for result in api_schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(op, mode, seen.setdefault((op.label, mode.value), {}))
    predict = ("POST /v1/models/{model_id}/predict", "negative")
    assert seen[predict].get(422, 0) > 0  # the malformed bodies reached the parsing
    assert sum(sum(c.values()) for c in seen.values()) >= 5 * len(seen)
