"""Records in the store, on SQLite and PostgreSQL: validation before any write, one
transaction per request, idempotency (also under a race), erasure, exact round trip."""

from __future__ import annotations

import threading
from base64 import b64decode, b64encode
from datetime import datetime

import numpy as np
import pytest
from sqlalchemy import func, select

from cloud_api.errors import InvalidRequest, NotFound, PayloadMismatch
from cloud_api.store import records as store
from cloud_api.store import tasks
from cloud_api.store.snapshot import label_counts, snapshot
from cloud_api.store.tables import idempotency
from cloud_api.store.tables import records as records_table
from shared.arrays import Limits
from shared.mechanisms import DChiEmbedding, DChiText
from shared.payload import make_payload
from tests.cloud_api.store.conftest import ETA, privatize, race, raw_records


def count(db) -> int:
    with db.begin() as conn:
        return conn.execute(select(func.count()).select_from(records_table)).scalar_one()


def limits(bundle, task) -> Limits:
    return Limits.for_bundle(bundle, labels=task.labels)


def store_raw(db, bundle, task, raw, key_id="k1", idem=None):
    env = store.RecordsBody(task=task.name, records=raw)
    recs = store.validate_records(task, env.records, limits(bundle, task))
    return store.add_records(db, task, recs, key_id, idem, store.body_digest(env))


def test_records_stored_in_order_with_class_names(db, task, tiny_bundle):
    payloads = privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 10)
    stored = store_raw(db, tiny_bundle, task, raw_records(payloads, [0, 1, "pos", "neg", 1,
                                                                      0, 0, 1, 1, 0]))
    assert len(stored.ids) == 10 and stored.ids == sorted(stored.ids)
    assert not stored.replayed
    with db.begin() as conn:
        rows = conn.execute(select(records_table.c.id, records_table.c.label,
                                   records_table.c.key_id, records_table.c.mechanism,
                                   records_table.c.params, records_table.c.created_at)
                            .order_by(records_table.c.id)).all()
    assert all(isinstance(r.created_at, datetime) for r in rows)
    assert {r.params["eta"] for r in rows} == {ETA}
    assert [r.id for r in rows] == stored.ids
    assert [r.label for r in rows] == ["neg", "pos", "pos", "neg", "pos", "neg", "neg", "pos",
                                       "pos", "neg"]
    assert {r.key_id for r in rows} == {"k1"} and {r.mechanism for r in rows} == {"dchi-text"}
    assert label_counts(db, "sst2") == {"neg": 5, "pos": 5}


@pytest.mark.parametrize("bad", ["eta", "label", "nan", "bundle", "mechanism", "unlabelled"])
def test_one_bad_record_stores_nothing(db, task, tiny_bundle, bad):
    payloads = privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 8)
    raw = raw_records(payloads)
    p = raw[5]["payload"]
    if bad == "eta":
        other = privatize(tiny_bundle, DChiText(tiny_bundle, 6), 1)
        raw[5] = raw_records(other)[0]
    elif bad == "label":
        raw[5]["label"] = "neutral"
    elif bad == "nan":
        task = tasks.ensure_task(db, "emb", ["neg", "pos"], "dchi-embedding", {"eta": ETA},
                                 tiny_bundle.bundle_id)[0]
        emb = privatize(tiny_bundle, DChiEmbedding(ETA), 8)
        raw = raw_records(emb)
        nan = np.full(emb[5].data_array().shape, np.nan, "<f4")
        raw[5]["payload"]["embeddings"]["data"] = b64encode(nan.tobytes()).decode()
    elif bad == "bundle":
        raw[5]["payload"] = {**p, "bundle_id": "ab" * 32}
    elif bad == "mechanism":
        raw[5]["payload"] = {**p, "mechanism": "none", "params": {}}
    elif bad == "unlabelled":
        del raw[5]["label"]
    with pytest.raises(InvalidRequest) as err:
        store_raw(db, tiny_bundle, task, raw)
    detail = err.value.detail
    assert detail.startswith("record 5: ") and "nothing was stored" in detail
    assert err.value.errors[0]["loc"][:2] == ["records", 5]
    if bad == "eta":
        assert isinstance(err.value, PayloadMismatch)
        assert f"eta 6 sent, task accepts eta {ETA:g}" in detail
    if bad == "bundle":
        assert isinstance(err.value, PayloadMismatch) and "bundle abababababab" in detail
    if bad == "mechanism":
        assert "mechanism none sent, task accepts dchi-text" in detail
    if bad == "nan":
        assert "NaN" in detail
    assert count(db) == 0


def test_unknown_task_is_404(db, tiny_bundle):
    with pytest.raises(NotFound, match="no task 'nope'"):
        tasks.get_task(db, "nope")
    with pytest.raises(NotFound):
        store.delete_records(db, task="nope")
    with pytest.raises(NotFound):
        snapshot(db, "nope")


def test_idempotent_retry_returns_same_ids_without_new_rows(db, task, tiny_bundle):
    raw = raw_records(privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 6))
    first = store_raw(db, tiny_bundle, task, raw, idem="upload-1")
    again = store_raw(db, tiny_bundle, task, [dict(reversed(list(r.items()))) for r in raw],
                      idem="upload-1")  # same body, other key order: same canonical body
    assert again.ids == first.ids and again.replayed and count(db) == 6
    # the same idempotency key from another caller is another request
    other = store_raw(db, tiny_bundle, task, raw, key_id="k2", idem="upload-1")
    assert set(other.ids).isdisjoint(first.ids) and count(db) == 12
    # same key, different body -> 422, nothing new
    raw[0]["label"] = 1 - raw[0]["label"]
    with pytest.raises(InvalidRequest, match="different body"):
        store_raw(db, tiny_bundle, task, raw, idem="upload-1")
    assert count(db) == 12


def test_racing_requests_with_one_key_store_once(db, task, tiny_bundle):
    raw = raw_records(privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 64))
    env = store.RecordsBody(task=task.name, records=raw)
    recs = store.validate_records(task, env.records, limits(tiny_bundle, task))
    digest = store.body_digest(env)
    answers = race([lambda: store.add_records(db, task, recs, "k1", "race-key", digest)] * 6,
                   timeout=60)
    assert all(isinstance(a, store.Stored) for a in answers), answers
    assert len({tuple(a.ids) for a in answers}) == 1
    assert sum(not a.replayed for a in answers) == 1
    assert count(db) == 64
    with db.begin() as conn:
        assert conn.execute(select(func.count()).select_from(idempotency)).scalar_one() == 1


def test_erasure_by_key_id(db, task, tiny_bundle):
    raw = raw_records(privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 5))
    a = store_raw(db, tiny_bundle, task, raw, key_id="alice", idem="a-1")
    b = store_raw(db, tiny_bundle, task, raw, key_id="bob")
    assert store.delete_records(db, key_id="alice") == 5
    with db.begin() as conn:
        left = conn.execute(select(records_table.c.id, records_table.c.key_id)).all()
    assert sorted(r.id for r in left) == b.ids and {r.key_id for r in left} == {"bob"}
    # the key's idempotency entries went too: the same request is stored anew
    again = store_raw(db, tiny_bundle, task, raw, key_id="alice", idem="a-1")
    assert not again.replayed and set(again.ids).isdisjoint(a.ids)
    assert store.delete_records(db, key_id="nobody") == 0


def stale_idempotency(db) -> list[tuple[str, str]]:
    """(key id, idempotency key) of every idempotency row naming a record not stored."""
    with db.begin() as conn:
        have = set(conn.execute(select(records_table.c.id)).scalars())
        rows = conn.execute(select(idempotency)).all()
    return [(r.key_id, r.idempotency_key) for r in rows if not set(r.record_ids) <= have]


ERASURES = {  # (sent request's ids, the task) -> delete_records selectors
    "task": lambda ids, t: {"task": t},
    "ids-part": lambda ids, t: {"ids": ids[1:3]},
    "ids-all": lambda ids, t: {"ids": ids},
    "key-task": lambda ids, t: {"key_id": "alice", "task": t},
    "key-ids": lambda ids, t: {"key_id": "alice", "ids": [ids[0]]},
    "key-task-ids": lambda ids, t: {"key_id": "alice", "task": t, "ids": ids[2:]},
    "key": lambda ids, t: {"key_id": "alice"},
}


@pytest.mark.parametrize("how", list(ERASURES))
def test_erasure_forgets_the_idempotency_answers_it_broke(db, task, tiny_bundle, how):
    raw = raw_records(privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 5))
    first = store_raw(db, tiny_bundle, task, raw, key_id="alice", idem="a-1")
    kept = store_raw(db, tiny_bundle, task, raw[:2], key_id="alice", idem="a-2")
    bob = store_raw(db, tiny_bundle, task, raw[:3], key_id="bob", idem="b-1")
    sel = ERASURES[how](first.ids, task.name)
    if "ids" in sel:  # only the first request's records: the others stay replayable
        assert store.delete_records(db, **sel) == len(sel["ids"])
    else:
        store.delete_records(db, **sel)
    assert stale_idempotency(db) == []
    # a replay of the erased request is a new request: stored afresh, ids that exist
    again = store_raw(db, tiny_bundle, task, raw, key_id="alice", idem="a-1")
    assert not again.replayed and set(again.ids).isdisjoint(first.ids)
    with db.begin() as conn:
        stored = set(conn.execute(select(records_table.c.id)).scalars())
    assert set(again.ids) <= stored and stale_idempotency(db) == []
    # requests whose records all survived still replay
    for sent, key_id, idem, rs in [(kept, "alice", "a-2", raw[:2]),
                                   (bob, "bob", "b-1", raw[:3])]:
        if set(sent.ids) <= stored:
            assert store_raw(db, tiny_bundle, task, rs, key_id=key_id, idem=idem) == \
                store.Stored(sent.ids, replayed=True)


def test_a_replay_whose_records_are_gone_stores_afresh(db, task, tiny_bundle):
    """An idempotency row naming erased records (left by an older version, or by an
    erasure racing the request) does not answer with those ids."""
    raw = raw_records(privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 4))
    first = store_raw(db, tiny_bundle, task, raw, idem="a-1")
    with db.begin(write=True) as conn:  # behind the store's back
        conn.execute(records_table.delete().where(records_table.c.id == first.ids[1]))
    again = store_raw(db, tiny_bundle, task, raw, idem="a-1")
    assert not again.replayed and set(again.ids).isdisjoint(first.ids) and count(db) == 7
    assert stale_idempotency(db) == []
    assert store_raw(db, tiny_bundle, task, raw, idem="a-1") == store.Stored(again.ids, True)


def test_delete_by_ids_and_by_task(db, task, tiny_bundle):
    other = tasks.ensure_task(db, "other", ["x", "y", "z"], "dchi-text", {"eta": ETA},
                              tiny_bundle.bundle_id)[0]
    raw = raw_records(privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 6))
    ids = store_raw(db, tiny_bundle, task, raw).ids
    ids2 = store_raw(db, tiny_bundle, other, raw).ids
    assert store.delete_records(db, ids=[ids[0], ids[2], ids[2], 10**9]) == 2
    assert store.delete_records(db, ids=ids2[:3], task="sst2") == 0  # selectors AND-ed
    assert store.delete_records(db, task="sst2") == 4
    assert count(db) == 6
    with pytest.raises(InvalidRequest, match="at least one"):
        store.delete_records(db)


@pytest.mark.parametrize("kind", ["dchi-embedding-f16", "dchi-embedding-f32", "dchi-text-pair",
                                  "ome", "texthide-soft"])
def test_payload_bytes_round_trip_exactly(db, tiny_bundle, kind):
    rng = np.random.default_rng(1)
    bid = tiny_bundle.bundle_id
    if kind.startswith("dchi-embedding"):
        mech, params = "dchi-embedding", {"eta": float(ETA)}
        from edge_agent import Privatizer

        f16 = kind.endswith("f16")
        priv = Privatizer(tiny_bundle, DChiEmbedding(ETA), float_dtype="float16" if f16
                          else "float32")
        payloads = priv.privatize(["the movie is good", "awful"], rng=rng)
        labels: list = ["pos", "neg"]
    elif kind == "dchi-text-pair":
        mech, params = "dchi-text", {"eta": float(ETA)}
        from edge_agent import Privatizer

        payloads = Privatizer(tiny_bundle, DChiText(tiny_bundle, ETA)).privatize(
            ["the movie", "a plot"], rng=rng, pairs=["is good", "was dull !"])
        labels = [0, 1]
    elif kind == "ome":
        mech, params = "ome", {"epsilon": 1.0, "lam": 1.5, "int_bits": 4, "frac_bits": 5}
        payloads = [make_payload(mech, params, bid, rng.integers(0, 2, 16 * 10 + 0))
                    for _ in range(2)]
        labels = [0, 1]
    else:
        mech, params = "texthide", {"m": 16, "k": 2}
        payloads = [make_payload(mech, params, bid, rng.normal(size=16).astype(np.float32))
                    for _ in range(2)]
        labels = [[0.25, 0.75], [1 / 3, 2 / 3]]
    task = tasks.ensure_task(db, "rt", ["neg", "pos"], mech, params, bid)[0]
    raw = raw_records(payloads, labels)
    ids = store_raw(db, tiny_bundle, task, raw).ids
    wm, rows = snapshot(db, "rt")
    got = list(rows)
    assert wm == ids[-1] and [i for i, _ in got] == ids
    for (_, rec), p, lab in zip(got, payloads, labels, strict=True):
        assert rec.payload == p  # dtype, shape, base64 of the same bytes, segments, params
        want = task.labels[lab] if isinstance(lab, int) else lab
        assert rec.label == want
    with db.begin() as conn:
        row = conn.execute(select(records_table.c.payload, records_table.c.dtype,
                                  records_table.c.shape).where(records_table.c.id == ids[0])
                           ).one()
    arr = getattr(payloads[0], payloads[0].array_field)
    assert isinstance(row.payload, bytes) and row.payload == b64decode(arr.data)
    assert row.dtype == arr.dtype and list(row.shape) == list(arr.shape)


def test_snapshot_reads_up_to_the_watermark_in_chunks(db, task, tiny_bundle):
    raw = raw_records(privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 20))
    ids = store_raw(db, tiny_bundle, task, raw).ids
    wm, rows = snapshot(db, task, chunk=7)
    later = store_raw(db, tiny_bundle, task, raw[:3]).ids  # after the watermark
    got = [i for i, _ in rows]
    assert wm == ids[-1] and got == ids and not set(later) & set(got)
    assert [i for i, _ in snapshot(db, task, watermark=ids[4])[1]] == ids[:5]
    store.delete_records(db, ids=later)  # ids are never reused: the watermark holds
    new = store_raw(db, tiny_bundle, task, raw[:1]).ids
    assert new[0] > later[-1]
    assert snapshot(db, "sst2", watermark=None)[0] == new[0]


def test_a_watermark_waits_for_records_still_being_written(db, task, tiny_bundle):
    """PostgreSQL hands out ids before the rows commit: request A takes ids, request B takes
    higher ones and commits first. A watermark taken then must not pass A's ids while A is
    in flight (they would appear below it later: a retried attempt, or another snapshot at
    the same watermark, would read other records)."""
    from datetime import UTC, datetime

    from cloud_api.store import bulk

    if db.dialect != "postgresql":
        pytest.skip("SQLite serializes writers: its ids commit in order")
    recs = store.validate_records(task, raw_records(privatize(
        tiny_bundle, DChiText(tiny_bundle, ETA), 3)), limits(tiny_bundle, task))
    seen: list = []

    def take() -> None:  # a worker claiming a retraining job
        wm, rows = snapshot(db, task)
        seen.append((wm, [i for i, _ in rows]))

    with db.begin(write=True) as conn:  # request A, in flight
        ids_a = bulk.allocate_ids(conn, len(recs))
        ids_b = store.add_records(db, task, recs, "k2").ids  # request B commits first
        assert ids_b[0] > ids_a[-1]
        taker = threading.Thread(target=take)
        taker.start()
        taker.join(1.0)  # time enough to run ahead of A (it must wait for A instead)
        when = bulk.created_at_value(conn, datetime.now(UTC))
        bulk.write_rows(conn, [(i, *store._row(task, r, "k1", when))
                               for i, r in zip(ids_a, recs, strict=True)])
    taker.join(30)
    assert seen == [(ids_b[-1], ids_a + ids_b)]
