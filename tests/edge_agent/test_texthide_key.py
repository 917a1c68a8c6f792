"""The TextHide key: at least 128 bits as hex, from a flag or the environment; the CLI
refuses small seeds (which anyone can find by trying) with a usage error."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from edge_agent.privatize.texthide_key import KEY_ENV, MAKE_ONE, SEED_ENV, key_to_seed, resolve_key
from shared.mechanisms import TextHide
from tests.edge_agent.conftest import TEXTHIDE_KEY, assert_one_line_error, run_cli


def test_key_to_seed_accepts_128_bit_hex():
    key = secrets.token_hex(16)
    assert key_to_seed(key) == int(key, 16)
    assert key_to_seed("0x" + key.upper()) == int(key, 16)
    assert key_to_seed(" " + key + "\n") == int(key, 16)
    long = secrets.token_hex(32)
    assert key_to_seed(long) == int(long, 16)
    # the same key always gives the same secret pool; another key another pool
    pool = TextHide(16, 1, 8, seed=key_to_seed(TEXTHIDE_KEY)).pool
    np.testing.assert_array_equal(pool, TextHide(16, 1, 8, seed=key_to_seed(TEXTHIDE_KEY)).pool)
    assert not np.array_equal(pool, TextHide(16, 1, 8, seed=key_to_seed(key)).pool)


@pytest.mark.parametrize("key", ["1", "5", "9", "123456789", "ab" * 15, "", "not hex at all",
                                 "g" * 32, "0" * 31 + "5", "0" * 12 + "f" * 20])
def test_weak_or_malformed_keys_are_refused(key):
    with pytest.raises(ValueError) as exc:
        key_to_seed(key, "--texthide-key")
    msg = str(exc.value)
    assert "--texthide-key must be a secret key of at least 32" in msg and MAKE_ONE in msg
    if len(key) > 2:
        assert key not in msg  # a key (even a bad one) is never repeated


def test_resolve_order_and_deprecated_aliases():
    a, b = secrets.token_hex(16), secrets.token_hex(16)
    assert resolve_key(None, None, {}) == (None, None)
    assert resolve_key(a, None, {KEY_ENV: b}) == (int(a, 16), None)
    seed, note = resolve_key(None, a, {KEY_ENV: b})
    assert seed == int(a, 16) and "--texthide-seed is deprecated" in note
    assert resolve_key(None, None, {KEY_ENV: b, SEED_ENV: a}) == (int(b, 16), None)
    seed, note = resolve_key(None, None, {SEED_ENV: a, KEY_ENV: ""})
    assert seed == int(a, 16) and f"${SEED_ENV} is deprecated" in note
    with pytest.raises(ValueError, match=f"\\${SEED_ENV} must be a secret key"):
        resolve_key(None, None, {SEED_ENV: "5"})
    with pytest.raises(ValueError, match="not both"):
        resolve_key(a, b, {})


@pytest.mark.parametrize(("flags", "env", "source"), [
    (["--texthide-key", "5"], {}, "--texthide-key"),
    (["--texthide-seed", "9"], {}, "--texthide-seed"),
    ([], {KEY_ENV: "deadbeef"}, f"${KEY_ENV}"),
    ([], {SEED_ENV: "1"}, f"${SEED_ENV}"),
], ids=["key", "seed-alias", "key-env", "seed-env"])
def test_cli_refuses_small_keys(tmp_path, tiny_enc_dir, flags, env, source):
    src = tmp_path / "in.txt"
    src.write_text("good movie\n")
    out = tmp_path / "out.jsonl"
    proc = run_cli("privatize", str(src), "--mechanism", "texthide", "--m", "4", *flags,
                   "--bundle", str(tiny_enc_dir), "-o", str(out), env=env)
    line = assert_one_line_error(proc, 2, f"{source} must be a secret key of at least 32")
    assert "secrets.token_hex(16)" in line
    assert not out.exists()


def test_cli_key_from_env_and_alias_reproduce_the_same_pool(tmp_path, tiny_enc_dir):
    """With --seed fixed, the key alone decides the masks: key flag, key variable and the
    deprecated alias give the same payloads; another key gives others."""
    src = tmp_path / "in.txt"
    src.write_text("good movie\nbad plot\n")
    base = ["privatize", str(src), "--mechanism", "texthide", "--m", "4", "--seed", "3",
            "--bundle", str(tiny_enc_dir)]
    by_flag = run_cli(*base, "--texthide-key", TEXTHIDE_KEY)
    by_env = run_cli(*base, env={KEY_ENV: TEXTHIDE_KEY})
    by_alias = run_cli(*base, "--texthide-seed", TEXTHIDE_KEY)
    other = run_cli(*base, "--texthide-key", secrets.token_hex(16))
    for proc in (by_flag, by_env, by_alias, other):
        assert proc.returncode == 0, proc.stderr
    assert by_flag.stdout == by_env.stdout == by_alias.stdout != other.stdout
    assert "--texthide-seed is deprecated" in by_alias.stderr
    assert "new secret mask pool" not in by_flag.stderr + by_env.stderr
    fresh = run_cli(*base)
    assert fresh.returncode == 0 and "new secret mask pool for this run only" in fresh.stderr
