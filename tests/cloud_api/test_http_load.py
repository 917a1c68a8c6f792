"""Concurrency against a real server: 200 predicts at once all answered with batches of more
than one formed; a promotion through the admin API under load with no failed request and
answers switching to the new version; a promotion by another process (the CLI) picked up
without a restart."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.cloud_api.conftest import body_of, cloud_api, payloads_for

TEXTS = ["a good film", "the plot was dull", "it is not very fun", "great story , love it",
         "boring actor and awful plot", "this movie was funny"]


def _batches(server, model: str) -> tuple[float, float]:
    """(forwards so far, forwards of more than one payload so far) of ``model``."""
    count = server.metric("privbert_batch_size_count", model=model)
    single = server.metric("privbert_batch_size_bucket", model=model, le="1.0")
    return count, count - single


def test_200_concurrent_predicts_are_all_answered_in_batches(server, tiny_bundle_of_home):
    model = server.model("text")
    bodies = [body_of(payloads_for(model, [TEXTS[i % len(TEXTS)]], tiny_bundle_of_home))
              for i in range(200)]
    before = _batches(server, "text")

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60,
                                     headers={**server.headers(),
                                              "Content-Type": "application/json"}) as c:
            return await asyncio.gather(*(c.post("/v1/models/text/predict", content=b)
                                          for b in bodies))

    answers = asyncio.run(run())
    assert [r.status_code for r in answers] == [200] * 200, \
        {r.status_code: r.text for r in answers if r.status_code != 200}
    assert all(len(r.json()["predictions"]) == 1 for r in answers)
    after = _batches(server, "text")
    forwards, multi = after[0] - before[0], after[1] - before[1]
    assert multi >= 1, f"{forwards} forwards, none of more than one payload"
    assert forwards < 200  # 200 payloads took fewer forwards than payloads


def test_promotion_under_load_fails_no_request_and_switches_version(server, tiny_home,
                                                                    tiny_bundle_of_home):
    current = server.model("text")["version"]
    src = tiny_home.root / "models" / "text" / "versions" / current
    reg = cloud_api("models", "register", str(src), "--model-id", "text",
                    "--home", str(tiny_home.root))
    assert reg.returncode == 0, reg.stderr
    new = reg.stdout.split()[2]
    assert new != current and reg.stdout.startswith(f"registered text {new}")
    body = body_of(payloads_for(server.model("text"), TEXTS[:2], tiny_bundle_of_home))
    results: list[tuple[float, float, int, str | None]] = []  # (sent, answered, status, ver)
    promoted_at: list[float] = []

    async def client(c: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            r = await c.post("/v1/models/text/predict", content=body)
            ver = r.json().get("version") if r.status_code == 200 else None
            results.append((sent, time.monotonic(), r.status_code, ver))

    async def run() -> None:
        stop = asyncio.Event()
        async with httpx.AsyncClient(base_url=server.url, timeout=60, headers={
                **server.headers(), "Content-Type": "application/json"}) as c:
            workers = [asyncio.create_task(client(c, stop)) for _ in range(32)]
            deadline = time.monotonic() + 60
            while len(results) < 50 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            r = await c.post("/admin/models/text/promote", json={"version": new},
                             headers=server.headers(server.admin_key))
            assert r.status_code == 200, r.text
            promoted_at.append(time.monotonic())
            while (sum(s > promoted_at[0] for s, *_ in results) < 50
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.01)
            stop.set()
            await asyncio.gather(*workers)

    asyncio.run(run())
    failed = [r for r in results if r[2] != 200]
    assert not failed, failed[:5]
    versions = [v for *_, v in results]
    assert current in versions and new in versions
    after = [v for sent, _, _, v in results if sent > promoted_at[0]]
    assert len(after) >= 50 and set(after) == {new}
    assert server.model("text")["version"] == new


def test_promotion_by_another_process_is_picked_up(server, tiny_home):
    """`cloud-api models register --promote` only writes files in the home; the server
    notices the pointer and serves the new version without a restart."""
    import json

    current = server.model("text")["version"]
    src = tiny_home.root / "models" / "text" / "versions" / current
    r = cloud_api("models", "register", str(src), "--model-id", "text", "--promote",
                  "--home", str(tiny_home.root))
    assert r.returncode == 0, r.stderr
    target = r.stdout.split()[2]
    assert f"promoted text {target}" in r.stdout
    deadline = time.monotonic() + 30
    while server.model("text")["version"] != target:
        assert time.monotonic() < deadline, "the promotion was not picked up"
        time.sleep(0.1)
    assert server.metric("privbert_model_loaded", model="text", version=target) == 1
    listing = json.loads(cloud_api("models", "list", "--json", "--home",
                                   str(tiny_home.root)).stdout)
    text = next(m for m in listing["models"] if m["id"] == "text")
    assert text["promoted"] == target and current in [v["version"] for v in text["versions"]]
