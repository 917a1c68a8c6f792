"""How often the quick start's five example sentences come out right, over fresh noise.

    python -m bench.demo_examples --model DIR [--draws 50] [--seed 0]

``scripts/demo.sh`` privatizes its five examples once, so whether its printout is right is
a random event. This privatizes them ``--draws`` times with the model's own mechanism and
parameters (as ``edge-agent privatize`` does), and prints, for each sentence, the share of
draws whose prediction is its label and the mean score of that label, then the share of
draws in which all five are right. ``DIR``: a model version folder (``cloud-api bootstrap``
writes them under ``$PRIVBERT_HOME/models/<id>/<version>``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

# scripts/demo.sh's examples, with their SST-2 labels (1 positive, 0 negative)
EXAMPLES = (
    ("a gripping, beautifully acted story that stays with you", "1"),
    ("the plot is dull and the jokes fall flat", "0"),
    ("one of the most charming films of the year", "1"),
    ("i wanted my two hours back", "0"),
    ("a tender and funny portrait of a family", "1"),
)


def _bundle_of(model: Path, bundle_id: str, given: str | None):
    """The bundle the model version was trained for: --bundle, else its home's copy (a
    version folder is HOME/models/ID/versions/V), else what ``models.training.privatize.load_bundle``
    finds for the version (its own bundle/, or the packaged MiniLM's)."""
    from cloud_api.home import ModelHome
    from models.training.privatize import load_bundle

    model = model.resolve()
    if given is None and len(model.parents) > 3:
        in_home = ModelHome(model.parents[3]).bundle_dir(bundle_id)
        given = str(in_home) if (in_home / "bundle.json").is_file() else None
    try:
        return load_bundle(bundle_dir=given, version_dir=model, expected_id=bundle_id)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--bundle", help="the model's bundle directory (default: the version's "
                    "bundle/, its home's bundles/<bundle_id>, or the packaged MiniLM's)")
    ap.add_argument("--draws", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    from models.training.data import LabelledText
    from models.training.finetune import predict_dataset
    from models.training.privatize import PublicText, build_mechanism, make_privatizer
    from models.versions.model_version import load_model

    mv = load_model(a.model)
    cfg = mv.config
    bundle = _bundle_of(Path(a.model), cfg["bundle_id"], a.bundle)
    names = list(cfg["labels"])
    mech = build_mechanism(cfg["mechanism"], bundle, **cfg["params"])
    priv = make_privatizer(bundle, mech, cfg.get("max_length", 128))
    texts = [t for t, _ in EXAMPLES]
    labels = [lab for _, lab in EXAMPLES]
    public = PublicText(LabelledText(texts=texts, labels=labels), names, priv)
    gold = np.array([names.index(lab) for lab in labels])
    rng = np.random.default_rng(a.seed)
    right = np.zeros((a.draws, len(texts)), dtype=bool)
    score = np.zeros((a.draws, len(texts)))
    for d in range(a.draws):
        ds = public.dataset(rng, progress=False)
        probs, _ = predict_dataset(mv.module, ds, bundle.special_ids, cfg.get("max_length", 128))
        right[d] = probs.argmax(1) == gold
        score[d] = probs[np.arange(len(texts)), gold]
    print(f"model {a.model}: {cfg['mechanism']} {cfg['params']}, {a.draws} fresh draws")
    for i, text in enumerate(texts):
        print(f"  right {right[:, i].mean():.2f}  mean score of its label "
              f"{score[:, i].mean():.2f}  {text}")
    print(f"all five right in {right.all(1).mean():.2f} of the draws; "
          f"mean right per draw {right.sum(1).mean():.2f} of 5")
    return 0


if __name__ == "__main__":
    sys.exit(main())
