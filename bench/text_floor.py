"""The text floor of issue 42: where its line lies, and what it costs at load.

    python -m bench.text_floor [--draws 3] [--node] [--policy]

* For the genuine MiniLM tables at their matched eta (``shared.table.MATCHED_ETA``, and the
  frontier's matched eta for pca16-int8 and pca64-int8) and the three crafted bundles of
  issue 42 at eta 65 (``tests/hostile_bundles.py``: built from the packaged model, genuine
  diameter): the shares unchanged and decoded (``shared.floor_text.measure_text``, OS
  entropy, ``--draws`` times), the draws it took, the uniform floor's verdict
  (``shared.floor``) and the text floor's, and the seconds each measurement took in Python.
* ``--node``: what the text floor adds to ``Privatizer.create`` in ``@privbert/edge``
  (bench/text_floor_node.mjs, Node, one thread, the loop search as a page with no
  WebAssembly yet): the known pca32-int8 bundle (no text floor: the baseline), an unverified
  32-d table (MiniLM's pca32 in float32, no bundle privbert ships) on its first load, and on a
  later load with the signed cache; medians of 5.
* ``--policy``: the rows under the token policy function-words at p = 0.3 instead (issue 41:
  the text floor then judges only the words outside the public list): the genuine tables at
  the η without a policy and at the frontier's policy η, and the crafted bundles with the
  policy block.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import REPO, load_avg, machine, table

CASES = [("none", 65.0), ("pca32-int8", 45.0), ("pca16-int8", 48.5), ("pca64-int8", 47.5),
         ("frequent-isolated", 65.0), ("char-tokenizer", 65.0), ("groups-of-four", 65.0)]
POLICY = "function-words"
POLICY_CASES = [(f"{n}+{POLICY}", eta) for n, eta in (
    ("none", 65.0), ("pca32-int8", 45.0), ("pca32-int8", 40.0), ("pca32-int8", 35.0),
    ("frequent-isolated", 65.0), ("groups-of-four", 65.0))]


def python_rows(draws: int, cases: list[tuple[str, float]]) -> list[list]:
    import sys

    sys.path.insert(0, str(REPO))
    from shared.bundle import EdgeBundle
    from shared.floor import weak_privacy_reason
    from shared.floor_text import measure_text, text_floor_reason
    from shared.mechanisms import DChiText
    from shared.policy import DEFAULT_P
    from tests.hostile_bundles import CRAFTED

    base = EdgeBundle.from_model()
    rows = []
    for case, eta in cases:
        name, _, policy = case.partition("+")
        b = CRAFTED[name](base) if name in CRAFTED else base.with_table(name)
        mech = DChiText(b.with_policy(policy), eta, public_p=DEFAULT_P) if policy else \
            DChiText(b, eta)
        got, secs = [], []
        for _ in range(draws):
            t0 = time.perf_counter()
            got.append(measure_text(mech))
            secs.append(time.perf_counter() - t0)
        uniform = "passes" if weak_privacy_reason(mech) is None else "refused"
        verdicts = {"passes" if text_floor_reason(mech, measured=m) is None else "refused"
                    for m in got}
        rows.append([case, f"{eta:g}", f"{got[0].pieces_per_word:.3f}",
                     " ".join(f"{m.unchanged_share:.3f}" for m in got),
                     " ".join(f"{m.decoded_share:.3f}" for m in got),
                     " ".join(str(m.draws) for m in got), uniform, "/".join(sorted(verdicts)),
                     " ".join(f"{s:.2f}" for s in secs)])
    return rows


def node_rows() -> str:
    from shared.bundle import EdgeBundle

    base = EdgeBundle.from_model()
    with tempfile.TemporaryDirectory() as tmp:
        known = base.with_table("pca32-int8").save(Path(tmp) / "known")
        unverified = base.with_table("pca32").save(Path(tmp) / "unverified")
        p = subprocess.run(["node", str(REPO / "bench" / "text_floor_node.mjs"), str(known),
                            str(unverified), "45"], cwd=REPO, capture_output=True, text=True,
                           timeout=3600)
        if p.returncode != 0:
            raise SystemExit(p.stderr)
        return p.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--node", action="store_true")
    ap.add_argument("--policy", action="store_true",
                    help=f"the cases under the token policy {POLICY} (p = 0.3) instead")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}; load {load_avg()}")
    print(table(["bundle", "eta", "pieces/word", "unchanged", "decoded (leave-one-out)",
                 "draws", "uniform floor", "text floor", "seconds (Python)"],
                python_rows(args.draws, POLICY_CASES if args.policy else CASES)))
    if args.node:
        print(node_rows())
    print(f"load after: {load_avg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
