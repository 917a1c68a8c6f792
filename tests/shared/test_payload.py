"""The wire contract: round trips, and refusal of every malformed payload."""

from __future__ import annotations

import base64
import copy
import json

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.arrays import MAX_JSON_BYTES, Array, Limits, encode_array
from shared.payload import (
    PAYLOAD_ADAPTER,
    DChiEmbeddingPayload,
    DChiTextPayload,
    LaplacePayload,
    NonePayload,
    OMEPayload,
    Record,
    TextHidePayload,
    make_payload,
    parse_payload,
    parse_record,
)

BID = "0123456789abcdef" * 4
FAST = settings(max_examples=40, deadline=None)
PARAMS = {
    "dchi-embedding": {"eta": 10.0},
    "dchi-text": {"eta": 10.0},
    "none": {},
    "laplace": {"epsilon": 1.0, "calibration": "coordinate", "word_dropout": 0.1},
    "ome": {"epsilon": 1.0, "lam": 2.0, "int_bits": 4, "frac_bits": 5},
    "texthide": {"m": 16, "k": 4},
}
DATA = {
    "dchi-embedding": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "dchi-text": np.array([101, 2000, 102]),
    "none": np.array([101, 2000, 102]),
    "laplace": np.linspace(-1, 1, 8),
    "ome": np.tile([1, 0, 1], 10),
    "texthide": np.linspace(-1, 1, 8),
}
TYPES = {
    "dchi-embedding": DChiEmbeddingPayload,
    "dchi-text": DChiTextPayload,
    "none": NonePayload,
    "laplace": LaplacePayload,
    "ome": OMEPayload,
    "texthide": TextHidePayload,
}
FIELD = {"dchi-embedding": "embeddings", "dchi-text": "token_ids", "none": "token_ids",
         "laplace": "vector", "ome": "bits", "texthide": "vector"}
TOKEN_KINDS = ("dchi-embedding", "dchi-text", "none")


def valid(mech: str) -> dict:
    """A valid payload of ``mech`` as a JSON-ready dict."""
    return json.loads(make_payload(mech, PARAMS[mech], BID, DATA[mech]).model_dump_json())


def raw_array(dtype: str, shape: tuple, raw: bytes) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data": base64.b64encode(raw).decode()}


def rejects(obj, limits: Limits | None = None, code: str | None = None) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        parse_payload(obj, limits)
    if code is not None:
        assert code in {e["type"] for e in info.value.errors()}, info.value
    return info.value


def check_round_trip(p, expected: np.ndarray) -> None:
    back = parse_payload(p.model_dump_json())
    assert type(back) is type(p) and back == p
    again = parse_record(json.dumps({"payload": json.loads(p.model_dump_json())}))
    for out in (back.data_array(), again.payload.data_array()):
        assert out.shape == expected.shape and out.dtype == expected.dtype
        assert out.tobytes() == expected.tobytes()


# ---- round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("mech", list(PARAMS))
def test_every_mechanism_round_trips(mech):
    p = make_payload(mech, PARAMS[mech], BID, DATA[mech])
    assert isinstance(p, TYPES[mech]) and p.mechanism == mech and p.version == 1
    dtype = {"ome": np.uint8, "dchi-text": np.int32, "none": np.int32}.get(mech, np.float32)
    check_round_trip(p, DATA[mech].astype(dtype))
    if mech in TOKEN_KINDS:
        assert p.n_tokens == 3


@FAST
@given(
    st.sampled_from(["float16", "float32"]),
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=12),
    st.data(),
)
def test_embeddings_round_trip(float_dtype, shape, data):
    width = 16 if float_dtype == "float16" else 32
    elems = st.floats(width=width, allow_nan=False, allow_infinity=False)
    arr = data.draw(hnp.arrays(np.dtype(float_dtype), shape, elements=elems))
    segs = data.draw(st.sampled_from([None, [shape[0]]] + ([[1, shape[0] - 1]] if shape[0] > 1 else [])))
    p = make_payload("dchi-embedding", {"eta": 3.5}, BID, arr, segments=segs,
                     float_dtype=float_dtype)
    assert p.embeddings.dtype == float_dtype and p.segments == segs
    check_round_trip(p, arr)


@FAST
@given(hnp.arrays(np.int64, st.integers(1, 40), elements=st.integers(0, 2**31 - 1)),
       st.sampled_from(["dchi-text", "none"]))
def test_token_ids_round_trip(ids, mech):
    check_round_trip(make_payload(mech, PARAMS[mech], BID, ids), ids.astype(np.int32))


@FAST
@given(hnp.arrays(np.float32, st.integers(1, 64),
                  elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
       st.sampled_from(["laplace", "texthide"]))
def test_vectors_round_trip(vec, mech):
    check_round_trip(make_payload(mech, PARAMS[mech], BID, vec), vec)


@FAST
@given(st.integers(0, 5), st.integers(0, 5), st.integers(1, 9), st.data())
def test_ome_bits_round_trip(int_bits, frac_bits, r, data):
    if int_bits + frac_bits == 0:
        int_bits = 1
    n = r * (1 + int_bits + frac_bits)
    bits = data.draw(hnp.arrays(np.uint8, n, elements=st.integers(0, 1)))
    params = {"epsilon": 2.0, "lam": 0.5, "int_bits": int_bits, "frac_bits": frac_bits}
    p = make_payload("ome", params, BID, bits)
    assert len(base64.b64decode(p.bits.data)) == (n + 7) // 8
    check_round_trip(p, bits)


def test_to_numpy_is_a_writable_native_copy():
    p = make_payload("dchi-embedding", {"eta": 1.0}, BID, DATA["dchi-embedding"])
    a = p.data_array()
    assert a.flags.writeable and a.dtype.isnative
    a[:] = 0
    assert p.data_array().any()


def test_little_endian_on_the_wire():
    arr = encode_array(np.array([1, 256]), "int32")
    assert base64.b64decode(arr.data) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert encode_array(np.array([1, 0, 1]), "bits").data == base64.b64encode(b"\xa0").decode()


# ---- rejection ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_nan_and_inf_rejected(bad, dtype):
    arr = np.ones((2, 3), dtype=dtype)
    arr[1, 2] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        encode_array(arr, dtype)
    obj = valid("dchi-embedding")
    obj["embeddings"] = raw_array(dtype, (2, 3), arr.astype("<" + arr.dtype.str[1:]).tobytes())
    assert "NaN or Inf" in str(rejects(obj, code="value_error"))


def test_float16_overflow_rejected():
    with pytest.raises(ValueError, match="NaN or Inf"):
        make_payload("dchi-embedding", {"eta": 1.0}, BID, np.full((1, 2), 7e4),
                     float_dtype="float16")


@pytest.mark.parametrize("mech,dtype", [
    ("dchi-embedding", "int32"), ("dchi-embedding", "bits"), ("dchi-text", "float32"),
    ("none", "bits"), ("laplace", "float16"), ("texthide", "int32"), ("ome", "float32"),
])
def test_wrong_dtype_for_kind(mech, dtype):
    obj = valid(mech)
    shape = obj[FIELD[mech]]["shape"]
    obj[FIELD[mech]] = json.loads(encode_array(np.ones(shape, dtype=np.int8), dtype)
                                  .model_dump_json())
    assert "dtype" in str(rejects(obj, code="value_error"))


@pytest.mark.parametrize("mech,arr", [
    ("dchi-embedding", np.ones(4, np.float32)),
    ("dchi-embedding", np.ones((2, 2, 2), np.float32)),
    ("dchi-text", np.ones((2, 3), np.int32)),
    ("none", np.ones((1, 3), np.int32)),
    ("laplace", np.ones((2, 4), np.float32)),
    ("texthide", np.ones((1, 4), np.float32)),
    ("ome", np.ones((2, 10), np.uint8)),
])
def test_wrong_shape(mech, arr):
    with pytest.raises(ValidationError, match="dimension"):
        make_payload(mech, PARAMS[mech], BID, arr)


@pytest.mark.parametrize("mech,arr", [
    ("dchi-embedding", np.ones((0, 4))),
    ("dchi-embedding", np.ones((3, 0))),
    ("dchi-text", np.ones(0, np.int32)),
    ("none", np.ones(0, np.int32)),
    ("laplace", np.ones(0)),
    ("texthide", np.ones(0)),
    ("ome", np.ones(0, np.uint8)),
])
def test_empty_rejected(mech, arr):
    with pytest.raises(ValidationError):
        make_payload(mech, PARAMS[mech], BID, arr)


def test_token_and_dim_limits():
    lim = Limits(max_tokens=4, max_dim=5)
    make_payload("dchi-embedding", {"eta": 1.0}, BID, np.ones((4, 5)), limits=lim)
    for arr in (np.ones((5, 5)), np.ones((4, 6))):
        with pytest.raises(ValidationError, match=r"must be in \[1, [45]\]"):
            make_payload("dchi-embedding", {"eta": 1.0}, BID, arr, limits=lim)
    with pytest.raises(ValidationError, match="L"):
        make_payload("dchi-text", {"eta": 1.0}, BID, np.ones(5, np.int64), limits=lim)
    with pytest.raises(ValidationError, match="dimension r"):
        make_payload("laplace", {"epsilon": 1.0}, BID, np.ones(6), limits=lim)
    # the defaults: 512 tokens, dimension 4096
    make_payload("dchi-text", {"eta": 1.0}, BID, np.ones(512, np.int64))
    with pytest.raises(ValidationError, match=r"\[1, 512\]"):
        make_payload("dchi-text", {"eta": 1.0}, BID, np.ones(513, np.int64))
    with pytest.raises(ValidationError, match="4096"):
        make_payload("texthide", {"m": 2, "k": 1}, BID, np.ones(4097))


def test_token_ids_range():
    for mech in ("dchi-text", "none"):
        with pytest.raises(ValidationError, match=">= 0"):
            make_payload(mech, PARAMS[mech], BID, np.array([3, -1, 2]))
        obj = valid(mech)
        parse_payload(obj, Limits(vocab_size=2001))
        assert PAYLOAD_ADAPTER.validate_python(obj, context={"limits": Limits(vocab_size=2001)})
        rejects(obj, Limits(vocab_size=2000), code="value_error")
        with pytest.raises(ValidationError, match="vocab_size") as info:
            DChiTextPayload.model_validate(valid("dchi-text"),
                                           context={"limits": Limits(vocab_size=102)})
        # the out-of-range id is payload data: the message does not repeat it
        biggest = str(int(DATA["dchi-text"].max()))
        assert biggest not in str(info.value).replace("vocab_size=102", "")
    with pytest.raises(TypeError, match="Limits"):
        DChiTextPayload.model_validate(valid("dchi-text"), context={"limits": {"vocab_size": 5}})
    with pytest.raises(ValueError, match="integer"):
        make_payload("dchi-text", {"eta": 1.0}, BID, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="int32 range"):
        make_payload("dchi-text", {"eta": 1.0}, BID, np.array([2**31]))


@pytest.mark.parametrize("data", ["!!!!!!!!", "AAAA AAA", "AAAAAA=A", "AAAAAAA", "QR==QQ=="])
def test_base64_garbage(data):
    obj = valid("laplace")
    obj["vector"] = {"dtype": "float32", "shape": [1], "data": data}
    rejects(obj)


def test_non_canonical_base64():
    obj = valid("ome")
    obj["params"] = {"epsilon": 1.0, "lam": 1.0, "int_bits": 1, "frac_bits": 0}
    obj["bits"] = {"dtype": "bits", "shape": [2], "data": "QB=="}  # decodes to b"@" too
    assert "canonical" in str(rejects(obj))
    obj["bits"]["data"] = "QA=="
    assert parse_payload(obj).data_array().tolist() == [0, 1]


@pytest.mark.parametrize("n_bytes", [0, 11, 13, 24])
def test_decoded_length_mismatch(n_bytes):
    obj = valid("laplace")
    obj["vector"] = raw_array("float32", (3,), bytes(n_bytes))
    assert "base64 of 12 bytes" in str(rejects(obj, code="value_error"))


def test_nonzero_padding_bits():
    obj = valid("ome")
    obj["params"].update(int_bits=1, frac_bits=1)  # l = 3, 9 bits -> 2 bytes, 7 padding bits
    obj["bits"] = raw_array("bits", (9,), b"\xff\x80")
    assert parse_payload(obj).data_array().tolist() == [1] * 9
    obj["bits"] = raw_array("bits", (9,), b"\xff\x81")
    assert "padding" in str(rejects(obj, code="value_error"))


@pytest.mark.parametrize("n", [29, 31, 5])
def test_ome_length_not_multiple_of_l(n):
    obj = valid("ome")
    obj["bits"] = json.loads(encode_array(np.ones(n, np.uint8), "bits").model_dump_json())
    assert "multiple of l=10" in str(rejects(obj, code="value_error"))


def test_ome_bit_limits():
    bits = np.ones(40, np.uint8)
    with pytest.raises(ValidationError, match="number of bits"):
        make_payload("ome", PARAMS["ome"], BID, bits, limits=Limits(max_bits=30))
    with pytest.raises(ValidationError, match="dimension r"):
        make_payload("ome", PARAMS["ome"], BID, bits, limits=Limits(max_dim=3))
    with pytest.raises(ValueError, match="0 or 1"):
        encode_array(np.array([0, 2]), "bits")


def test_unknown_mechanism_and_version():
    obj = valid("laplace")
    rejects(obj | {"mechanism": "gaussian"}, code="union_tag_invalid")
    rejects({k: v for k, v in obj.items() if k != "mechanism"}, code="union_tag_not_found")
    rejects(obj | {"version": 2}, code="literal_error")
    rejects(obj | {"version": "1"}, code="literal_error")
    with pytest.raises(ValueError, match="mechanism"):
        make_payload("gaussian", {}, BID, np.ones(3))


@pytest.mark.parametrize("mech", list(PARAMS))
def test_unknown_fields_rejected(mech):
    obj = valid(mech)
    rejects(obj | {"text": "my secret sentence"}, code="extra_forbidden")
    inner = copy.deepcopy(obj)
    inner["params"]["text"] = "my secret sentence"
    rejects(inner, code="extra_forbidden")
    inner = copy.deepcopy(obj)
    inner[FIELD[mech]]["text"] = "my secret sentence"
    rejects(inner, code="extra_forbidden")
    with pytest.raises(ValidationError):
        parse_record({"payload": obj, "text": "my secret sentence"})


@pytest.mark.parametrize("bid", ["", "0" * 63, "0" * 65, "A" * 64, "g" * 64, 7, None])
def test_bad_bundle_id(bid):
    rejects(valid("dchi-text") | {"bundle_id": bid})


@pytest.mark.parametrize("segs", [[1, 1], [4], [1, 1, 1], [0, 3], [3, 0], [], [-1, 4], [1.5, 1.5],
                                  ["1", "2"]])
def test_bad_segments(segs):
    for mech in TOKEN_KINDS:
        rejects(valid(mech) | {"segments": segs})
    with pytest.raises(ValidationError):
        make_payload("dchi-text", {"eta": 1.0}, BID, DATA["dchi-text"], segments=segs)


@pytest.mark.parametrize("mech", ["laplace", "texthide", "ome"])
def test_segments_on_vector_kind(mech):
    rejects(valid(mech) | {"segments": [1]}, code="extra_forbidden")
    with pytest.raises(ValidationError):
        make_payload(mech, PARAMS[mech], BID, DATA[mech], segments=[1])


def test_oversize_array():
    obj = valid("dchi-embedding")
    obj["embeddings"] = {"dtype": "float32", "shape": [512, 4096], "data": ""}  # 8 MiB
    assert "max_array_bytes" in str(rejects(obj))
    with pytest.raises(ValueError, match="max_array_bytes"):
        make_payload("laplace", {"epsilon": 1.0}, BID, np.ones(26),
                     limits=Limits(max_array_bytes=100))
    make_payload("laplace", {"epsilon": 1.0}, BID, np.ones(25), limits=Limits(max_array_bytes=100))


def test_oversize_json():
    text = json.dumps(valid("laplace"))
    assert parse_payload(text.encode()).mechanism == "laplace"
    big = text + " " * (MAX_JSON_BYTES - len(text) + 1)
    for obj in (big, big.encode()):
        with pytest.raises(ValueError, match="max_json_bytes"):
            parse_payload(obj)
        with pytest.raises(ValueError, match="max_json_bytes"):
            parse_record(obj)
    with pytest.raises(ValueError, match="max_json_bytes"):
        parse_payload(text, Limits(max_json_bytes=len(text) - 1))
    rejects("{not json")


@pytest.mark.parametrize("mech,params", [
    ("dchi-embedding", {"eta": 0}), ("dchi-embedding", {"eta": -1.0}),
    ("dchi-text", {"eta": float("nan")}), ("dchi-text", {"eta": float("inf")}),
    ("dchi-text", {"eta": "1.0"}), ("dchi-text", {"eta": True}), ("dchi-text", {}),
    ("laplace", {"epsilon": 1.0, "word_dropout": 1.0}),
    ("laplace", {"epsilon": 1.0, "word_dropout": -0.1}),
    ("laplace", {"epsilon": 1.0, "calibration": "published"}),
    ("laplace", {"epsilon": 0.0}),
    ("ome", {"epsilon": 1.0, "lam": 0.0}), ("ome", {"epsilon": 1.0}),
    ("ome", {"epsilon": 1.0, "lam": 1.0, "int_bits": 0, "frac_bits": 0}),
    ("ome", {"epsilon": 1.0, "lam": 1.0, "int_bits": 20, "frac_bits": 11}),
    ("ome", {"epsilon": 1.0, "lam": 1.0, "int_bits": 30, "frac_bits": 0}),
    ("ome", {"epsilon": 1.0, "lam": 1.0, "int_bits": -1, "frac_bits": 5}),
    ("texthide", {"m": 16, "k": 0}), ("texthide", {"m": 0, "k": 1}),
    ("texthide", {"m": 16, "k": 1.5}), ("texthide", {"m": 16}),
    ("none", {"eta": 1.0}),
])
def test_invalid_params(mech, params):
    obj = valid(mech)
    obj["params"] = params
    rejects(obj)
    rejects(json.dumps(obj))


def test_record_labels():
    p = valid("texthide")
    for label in (None, 0, 3, "positive", "entailment", "a.b:c-d_1", [0.25, 0.75], [1, 0]):
        assert parse_record({"payload": p, "label": label}).label == label
    bad = ("", "two words", "x" * 65, "ünï", "a\nb", [], [float("nan")], [float("inf")],
           [0.5] * 1001, ["a"], {"x": 1}, True, 1.5)
    for label in bad:
        with pytest.raises(ValidationError):
            parse_record({"payload": p, "label": label})
    with pytest.raises(ValidationError):
        parse_record({"label": 1})


def test_task_labels_close_the_free_text_channel():
    """With the task's class names in Limits, a label cannot carry free text."""
    p = valid("texthide")
    lim = Limits(labels=("negative", "positive"))
    for label in ("positive", 0, 1, [0.3, 0.7], None):
        assert parse_record({"payload": p, "label": label}, lim).label == label
    for label in ("patient:john.smith_HIV-positive", 2, -1, [1.0], [0.2, 0.3, 0.5]):
        parse_record({"payload": p, "label": label})  # a bare Limits accepts the shape...
        with pytest.raises(ValidationError) as err:  # ...the task's labels do not
            parse_record({"payload": p, "label": label}, lim)
        assert "john" not in str(err.value).split("input_value")[0]  # message names no text


def test_limits_for_bundle_pins_ids_and_dimensions(tiny_bundle):
    lim = Limits.for_bundle(tiny_bundle)
    assert (lim.vocab_size, lim.dim) == (tiny_bundle.vocab_size, tiny_bundle.dim)
    n, v = tiny_bundle.dim, tiny_bundle.vocab_size
    ok = make_payload("dchi-embedding", {"eta": 1.0}, BID, np.zeros((2, n)))
    parse_payload(ok.model_dump(), lim)
    with pytest.raises(ValidationError, match=f"embedding dimension n must be {n}"):
        parse_payload(make_payload("dchi-embedding", {"eta": 1.0}, BID,
                                   np.zeros((2, n + 1))).model_dump(), lim)
    with pytest.raises(ValidationError, match="vocab_size"):
        parse_payload(make_payload("dchi-text", {"eta": 1.0}, BID,
                                   np.array([v])).model_dump(), lim)
    with pytest.raises(ValidationError, match="vocab_size"):  # 4 bytes of text per "id"
        parse_payload(make_payload("none", {}, BID, np.array([2**31 - 1])).model_dump(), lim)
    enc = tiny_bundle.with_encoder(b"onnx", {"pooling": "mean", "output_dim": 8})
    lim = Limits.for_bundle(enc, labels=["0", "1"])
    assert lim.vector_dim == 8 and lim.labels == ("0", "1")
    parse_payload(make_payload("laplace", PARAMS["laplace"], BID, np.zeros(8)).model_dump(), lim)
    with pytest.raises(ValidationError, match="vector dimension r must be 8"):
        parse_payload(make_payload("texthide", PARAMS["texthide"], BID,
                                   np.zeros(9)).model_dump(), lim)
    with pytest.raises(ValidationError, match="vector dimension r must be 8"):
        parse_payload(make_payload("ome", PARAMS["ome"], BID,
                                   np.zeros(9 * 10, dtype=np.uint8)).model_dump(), lim)


# ---- the "no field can hold raw text" guard ----------------------------------------------


def _walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_no_field_can_hold_raw_text():
    schema = Record.model_json_schema()
    strings = objects = 0
    for path, node in _walk(schema):
        types = node.get("type")
        types = types if isinstance(types, list) else [types]
        if "string" in types:
            strings += 1
            assert "pattern" in node or "enum" in node or "const" in node, path
            if path.endswith(".data"):
                assert node["pattern"] == "^[A-Za-z0-9+/]*={0,2}$"
        if "object" in types and "properties" in node:
            objects += 1
            assert node.get("additionalProperties") is False, path
    assert strings >= 10 and objects >= 10
    assert schema["$defs"]["NoneParams"]["additionalProperties"] is False


def test_array_model_direct():
    a = Array.model_validate({"dtype": "int32", "shape": [2], "data": "AQAAAAIAAAA="})
    assert a.to_numpy().tolist() == [1, 2] and a.size == 2
    with pytest.raises(ValidationError):
        Array.model_validate({"dtype": "int64", "shape": [1], "data": "AQAAAAAAAAA="})
    with pytest.raises(ValidationError):
        Array.model_validate({"dtype": "int32", "shape": [-1], "data": ""})


@pytest.mark.parametrize(("dtype", "width", "src"), [
    ("float32", 384, np.float64), ("float16", 384, np.float32),  # rows of whole b64 groups
    ("float32", 5, np.float64), ("int32", None, np.int64),       # rows that are not
])
def test_encode_rows_equals_encode_array_per_slice(dtype, width, src):
    from shared.arrays import encode_rows

    rng = np.random.default_rng(4)
    lengths = [3, 1, 7, 2]
    shape = (sum(lengths),) if width is None else (sum(lengths), width)
    arr = (rng.integers(0, 30000, shape) if dtype == "int32"
           else rng.standard_normal(shape)).astype(src)
    before = arr.copy()
    got = encode_rows(arr, lengths, dtype)
    ends = np.cumsum(lengths)
    for a, chunk in zip(got, np.split(arr, ends[:-1]), strict=True):
        want = encode_array(chunk, dtype)
        assert (a.dtype, a.shape, a.data) == (want.dtype, want.shape, want.data)
        np.testing.assert_array_equal(a.to_numpy(), want.to_numpy())
        assert Array.model_validate(a.model_dump()) == a  # the JSON form decodes the same
    np.testing.assert_array_equal(arr, before)
    assert arr.flags.writeable  # the caller's array is not frozen or shared


def test_encode_rows_checks_like_encode_array():
    from shared.arrays import encode_rows

    x = np.zeros((4, 6))
    with pytest.raises(ValueError, match="sum to 4"):
        encode_rows(x, [1, 2], "float32")
    x[3, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        encode_rows(x, [2, 2], "float32")
    with pytest.raises(ValueError, match="max_array_bytes"):
        encode_rows(np.zeros((4, 6)), [1, 3], "float32", Limits(max_array_bytes=60))
    with pytest.raises(ValueError, match="bits"):
        encode_rows(np.zeros((4, 6)), [2, 2], "bits")


def test_mechanism_names_are_the_payload_kinds():
    """The CLIs' --mechanism choices (shared.payload.MECHANISMS) are exactly the kinds a
    payload can carry: a mechanism added to one list and not the other fails here."""
    from shared.payload import MECHANISMS, PAYLOAD_FIELDS

    assert len(MECHANISMS) == len(set(MECHANISMS))
    assert set(MECHANISMS) == set(PAYLOAD_FIELDS)
