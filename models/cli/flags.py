"""The command-line pieces the training commands share (``cloud-api train``, ``evaluate``,
``bootstrap``): the mechanism flags (derived from the mechanism spec, one per parameter of a
mechanism's ``Params``), the recipe's levers, the device, argument types, and what a parsed
command line gives, typed (``MechanismFlags``, ``RecipeFlags``, ``DeviceFlags``: parsed once
by each command, ``models.cli.options``), and what they give (the mechanism's settings, a
seeded generator, a posterior table).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_agent.mechanism_spec import flag_values, names
from edge_agent.param_flags import add_param_flags, positive_int
from edge_agent.privatize.texthide_key import key_to_seed
from models.cli.options import options_of
from models.training.posterior import ChannelPosterior
from models.training.privatize import SEED_WARNING
from shared.policy import DEFAULT_P, NO_POLICY, POLICIES, PolicyError, policy_name
from shared.table import TableError, TableSpec

if TYPE_CHECKING:
    from shared.bundle import EdgeBundle

PROG = "cloud-api"


def table_name(text: str) -> str:
    try:
        return TableSpec.parse(text).name
    except TableError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def texthide_key(text: str) -> int:
    """The mask-pool seed of a hex key, checked as the edge agent checks it."""
    try:
        return key_to_seed(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_mechanism_args(p: argparse.ArgumentParser) -> None:
    """--mechanism and one flag per parameter of the mechanisms' ``Params`` (from the
    mechanism spec: ``edge_agent.mechanism_spec``), a flag not given taking the default its
    mechanisms share; the TextHide key, the bundle, its table and the seed."""
    g = p.add_argument_group("privatization (as on the edge)")
    g.add_argument("--mechanism", choices=names(),
                   help="payload mechanism (none = Null-privacy baseline)")
    add_param_flags(g, with_defaults=True)
    g.add_argument("--texthide-key", type=texthide_key, metavar="HEX",
                   help="texthide: the client's secret mask-pool key, >= 32 hex digits as for "
                        "edge-agent (needed again to evaluate; never stored with the model)")
    g.add_argument("--bundle", metavar="DIR",
                   help="edge bundle (needed for laplace/ome/texthide: cloud-api export-bundle)")
    g.add_argument("--table", metavar="NAME", type=table_name,
                   help="dchi-text: build the bundle with this privatization table from the "
                        "base model (shared.table: none, pca32-int8, pca64, ...; "
                        "cloud-api export-bundle --table writes one to a folder)")
    g.add_argument("--policy", metavar="NAME", type=policy_arg,
                   help="dchi-text, dchi-embedding: build the bundle with this token policy "
                        "(shared.policy: its public words are sent as typed with probability "
                        "1 - public_p; " + ", ".join(POLICIES) + ", or none)")
    g.add_argument("--seed", type=int,
                   help="reproducible privatization and training (prints a warning)")


def policy_arg(s: str) -> str:
    """A ``--policy`` value (argparse's error on an unknown one)."""
    try:
        return policy_name(s)
    except PolicyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class MechanismFlags:
    """What ``add_mechanism_args`` parses, but ``--mechanism`` (each command's own: required
    by one, defaulted by another): every parameter flag by parameter name (None: not given,
    or the default its mechanisms share), the TextHide key's seed, the bundle, its table,
    the token policy and the seed."""

    values: Mapping[str, Any]
    texthide_key: int | None = None
    bundle: str | None = None
    table: str | None = None
    policy: str | None = None
    seed: int | None = None

    @classmethod
    def parse(cls, args: argparse.Namespace) -> MechanismFlags:
        return options_of(cls, args, values=flag_values(vars(args)))

    def settings(self) -> dict[str, Any]:
        """The mechanism's settings (a new dict): every parameter flag and the TextHide key,
        as ``models.training.privatize.build_mechanism`` takes them."""
        return {**self.values, "texthide_key": self.texthide_key}


def apply_policy(bundle: EdgeBundle, policy: str | None, params: dict[str, Any]) -> EdgeBundle:
    """The bundle under token ``policy`` (None: as it is) and ``params`` with its p: a
    policy asked for without ``public_p`` takes :data:`shared.policy.DEFAULT_P`."""
    if policy is None:
        return bundle
    if policy == NO_POLICY:
        if params.get("public_p") is not None:
            raise ValueError("--public-p needs a token policy (--policy NAME)")
        return bundle.with_policy(None) if bundle.policy is not None else bundle
    if "public_p" in params and params["public_p"] is None:
        params["public_p"] = DEFAULT_P
    return bundle.with_policy(policy)


def add_recipe_args(p: argparse.ArgumentParser) -> None:
    """The training recipe's levers (models.training.recipe); unset = the default for the mechanism."""
    g = p.add_argument_group(
        "recipe (models.training.recipe; default: the best measured recipe for the mechanism, "
        "bench/results/utility_levers.md)")
    g.add_argument("--fresh-noise", action=argparse.BooleanOptionalAction, default=None,
                   help="privatize the public training text afresh in every epoch")
    g.add_argument("--posterior", action=argparse.BooleanOptionalAction, default=None,
                   help="read each token through the channel posterior E[phi(x) | y] "
                        "(dchi-text, dchi-embedding; post-processing: no privacy cost)")
    g.add_argument("--posterior-table", metavar="FILE",
                   help="a posterior.npz to read (default: built from the public training "
                        "text; with --records: the --base version's)")
    g.add_argument("--denoise", type=float, metavar="LAMBDA",
                   help="weight of the auxiliary loss predicting the original tokens (0 = off)")
    g.add_argument("--distill", type=float, metavar="ALPHA",
                   help="weight of distillation from a teacher reading the original text "
                        "(0 = off)")
    g.add_argument("--rtd", type=float, metavar="RHO",
                   help="weight of replaced-token detection: predict at each position whether "
                        "the mechanism changed the token (ELECTRA-style; 0 = off)")
    g.add_argument("--ema", type=float, metavar="DECAY",
                   help="keep and evaluate an exponential moving average of the weights with "
                        "this decay per step, e.g. 0.999 (0 = off)")
    g.add_argument("--warm-start", action=argparse.BooleanOptionalAction, default=None,
                   help="start from a teacher fine-tuned on the original text, then fine-tune "
                        "on the privatized text")
    g.add_argument("--teacher", metavar="DIR", help="the teacher of --distill / --warm-start: a "
                   "model version of mechanism none (default: one trained on the same text "
                   "first, one epoch)")
    g.add_argument("--denoiser", action=argparse.BooleanOptionalAction, default=None,
                   help="read each token through a contextual denoiser E[phi(x) | y, context] "
                        "trained on public text (dchi-text; post-processing: no privacy cost)")
    g.add_argument("--denoiser-file", metavar="FILE",
                   help="a trained denoiser.safetensors to read (default: trained on the public "
                        "training text; with --records: the --base version's)")
    g.add_argument("--denoiser-corpus", metavar="FILE",
                   help="more public text (one per line) to train the denoiser on")
    g.add_argument("--denoiser-layers", type=positive_int, metavar="N",
                   help="transformer layers of the denoiser (default 2)")
    g.add_argument("--denoiser-candidates", type=positive_int, metavar="N",
                   help="most frequent public-text tokens it scores, besides the output "
                        "itself (default 4096)")
    g.add_argument("--denoiser-epochs", type=positive_int, metavar="N",
                   help="passes over the public text, privatized afresh each (default 1)")


@dataclass(frozen=True)
class RecipeFlags:
    """What ``add_recipe_args`` parses (None: not given, the recipe's default)."""

    fresh_noise: bool | None = None
    posterior: bool | None = None
    posterior_table: str | None = None
    denoise: float | None = None
    distill: float | None = None
    rtd: float | None = None
    ema: float | None = None
    warm_start: bool | None = None
    teacher: str | None = None
    denoiser: bool | None = None
    denoiser_file: str | None = None
    denoiser_corpus: str | None = None
    denoiser_layers: int | None = None
    denoiser_candidates: int | None = None
    denoiser_epochs: int | None = None


def seeded_rng(seed: int | None) -> np.random.Generator | None:
    """A generator of ``seed`` (with the warning that seeded noise protects nothing), else
    None: fresh OS entropy."""
    if seed is None:
        return None

    print(f"{PROG}: {SEED_WARNING}", file=sys.stderr)
    return np.random.default_rng(seed)


def add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                   help="autocast on CUDA (auto: bf16 where supported, else fp16; CPU: fp32)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


@dataclass(frozen=True)
class DeviceFlags:
    """What ``add_device_args`` parses."""

    device: str = "auto"
    precision: str = "auto"
    progress: bool = True

    @classmethod
    def parse(cls, args: argparse.Namespace) -> DeviceFlags:
        return options_of(cls, args, progress=not args.no_progress)

    def check(self) -> None:
        """A device and precision this machine has (ValueError, one line), before any work."""
        # lazy: torch, only when a command runs (its parser and --help load none)
        from models.nets.backbone import autocast_dtype, pick_device

        autocast_dtype(pick_device(self.device), self.precision)


def posterior_table(path: str | os.PathLike[str]) -> ChannelPosterior:
    return ChannelPosterior.load(path)
