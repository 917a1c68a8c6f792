"""The training recipe: what a classifier is trained with beyond the mechanism and the
hyperparameters, and where each part applies.

Levers (each measured alone and combined by ``python -m bench.utility explore`` and
``levers``; figures in the bench results, "Utility levers"):

* ``fresh_noise``: privatize every public training sentence afresh in each epoch (data
  augmentation with the exact mechanism). Needs the raw public text.
* ``denoise`` (λ): auxiliary loss predicting each original token from the privatized
  sequence (``models.training.objectives``; Qu et al. §3.4's Denoising MLM inside fine-tuning).
  Needs the original tokens: raw public text.
* ``distill`` (α): soft targets of a teacher that read the original text. Needs the raw
  public text and a teacher.
* ``warm_start``: start from that teacher's weights (fine-tuned on the clean text first),
  then fine-tune on the privatized text: a two-stage curriculum. Needs the raw public text.
* ``posterior``: channel-posterior inputs E[φ(x) | y] (``models.training.posterior``). Post-processing
  of the payload: works on device records and at prediction time as well, ``dchi-text`` and
  ``dchi-embedding`` only.
* ``denoiser``: contextual channel-posterior inputs E[φ(x) | y, context] of a small denoiser
  trained on public text (``models.attacks.denoiser``), read in place of the posterior table.
  Post-processing too, ``dchi-text`` only: training one needs public text, reading one
  (device records, prediction) does not.

A retraining job from device records has no raw text: only ``posterior`` and an existing
``denoiser`` apply there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from shared.mechanisms import registry

RAW_TEXT_LEVERS = ("fresh_noise", "denoise", "rtd", "distill", "warm_start")
# payloads of word pieces (a BERT over token ids reads them)
TOKEN_MECHANISMS = tuple(c.name for c in registry.mechanisms()
                         if c.payload_kind.reads_tokens)
# the named Null-privacy baseline: its tokens are the originals
PLAIN_MECHANISMS = tuple(c.name for c in registry.mechanisms() if not c.private)


@dataclass(frozen=True)
class Recipe:
    fresh_noise: bool = False
    posterior: bool = False
    denoise: float = 0.0
    denoise_rate: float = 0.5
    distill: float = 0.0
    distill_temperature: float = 2.0
    warm_start: bool = False
    posterior_passes: float = 1.0  # mechanism runs per public-text token for the table
    posterior_min_draws: int = 16
    denoiser: bool = False
    denoiser_layers: int = 2
    denoiser_candidates: int = 4096
    denoiser_epochs: int = 1
    denoiser_corpus: str | None = None  # more public text (one per line) to train it on
    ema: float = 0.0  # decay of an exponential moving average of the weights (0 = off)
    rtd: float = 0.0  # weight of replaced-token detection (ELECTRA-style; 0 = off)

    def levers(self) -> list[str]:
        """The levers switched on, by name."""
        on = []
        if self.fresh_noise:
            on.append("fresh_noise")
        if self.posterior:
            on.append("posterior")
        if self.denoise:
            on.append("denoise")
        if self.rtd:
            on.append("rtd")
        if self.distill:
            on.append("distill")
        if self.warm_start:
            on.append("warm_start")
        if self.denoiser:
            on.append("denoiser")
        if self.ema:
            on.append("ema")
        return on

    def check(self, mechanism: str, raw_text: bool) -> None:
        """ValueError (one line) for a lever that makes no sense for ``mechanism`` or needs
        raw text the training source does not have (``raw_text`` False: device records)."""
        if not (0 <= self.denoise < 100 and 0 < self.denoise_rate <= 1):
            raise ValueError(f"--denoise must be in [0, 100) and --denoise-rate in (0, 1], "
                             f"got {self.denoise}, {self.denoise_rate}")
        if not 0 <= self.rtd < 100:
            raise ValueError(f"--rtd must be in [0, 100), got {self.rtd}")
        if self.rtd and (mechanism not in TOKEN_MECHANISMS or mechanism in PLAIN_MECHANISMS):
            raise ValueError(f"--rtd makes no sense for {mechanism}: no privatized tokens to "
                             "tell from the originals")
        if not 0 <= self.ema < 1:
            raise ValueError(f"--ema must be in [0, 1), got {self.ema}")
        if not (0 <= self.distill <= 1 and 0 < self.distill_temperature <= 100):
            raise ValueError(f"--distill must be in [0, 1] and its temperature in (0, 100], "
                             f"got {self.distill}, {self.distill_temperature}")
        if not (self.posterior_passes > 0 and self.posterior_min_draws >= 1):
            raise ValueError("posterior passes must be > 0 and min draws >= 1")
        if not (1 <= self.denoiser_layers <= 48 and self.denoiser_candidates >= 1
                and self.denoiser_epochs >= 1):
            raise ValueError("--denoiser-layers must be in [1, 48], --denoiser-candidates and "
                             "--denoiser-epochs >= 1")
        if self.denoiser and mechanism not in registry.substituting_names():
            raise ValueError(f"--denoiser makes no sense for {mechanism}: a contextual "
                             f"denoiser exists for {' and '.join(registry.substituting_names())} only")
        if self.posterior and mechanism not in registry.dchi_names():
            raise ValueError(f"--posterior makes no sense for {mechanism}: a channel "
                             f"posterior exists for {' and '.join(registry.dchi_names())} only")
        if self.denoise and mechanism not in TOKEN_MECHANISMS:
            raise ValueError(f"--denoise makes no sense for {mechanism}: its payload has no "
                             "tokens to denoise")
        if self.denoise and mechanism in PLAIN_MECHANISMS:
            raise ValueError(f"--denoise makes no sense for {mechanism}: its tokens are the "
                             "originals")
        if (self.distill or self.warm_start) and mechanism in PLAIN_MECHANISMS:
            raise ValueError(f"--{'distill' if self.distill else 'warm-start'} makes no sense "
                             f"for {mechanism}: the model reads the text the teacher reads")
        if (self.distill or self.warm_start) and mechanism not in TOKEN_MECHANISMS:
            raise ValueError(f"--{'distill' if self.distill else 'warm-start'} makes no sense "
                             f"for {mechanism}: the teacher is a BERT over token ids")
        if not raw_text:
            need = [name for name in RAW_TEXT_LEVERS if name in self.levers()]
            if need:
                raise ValueError(f"{', '.join(need)} need the raw public text; device records "
                                 "have none (only the posterior and an existing denoiser "
                                 "apply to them)")

    def for_records(self) -> Recipe:
        """This recipe less the levers that need raw text."""
        return replace(self, fresh_noise=False, denoise=0.0, rtd=0.0, distill=0.0,
                       warm_start=False)

    def as_dict(self) -> dict:
        return {**asdict(self), "levers": self.levers()}

    @classmethod
    def from_dict(cls, d: dict | None) -> Recipe:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})


# The training defaults by payload kind (models.training.finetune): MiniLM reading token ids learns
# the privatized text best at 1e-4 over 2 epochs of fresh noise (bench results, "Utility
# levers"); reading embeddings keeps BERT's 2e-5; the vector MLP 1e-3.
DEFAULT_LR = {"tokens": 1e-4, "embeddings": 2e-5, "vector": 1e-3}
DEFAULT_EPOCHS = 2


def default_recipe(mechanism: str, raw_text: bool) -> Recipe:
    """The recipe ``cloud-api train`` and ``bootstrap`` use unless told otherwise: the
    winner of the ablation where it applies (bench/results/utility_levers.md)."""
    if mechanism not in registry.dchi_names():
        return Recipe()
    r = Recipe(fresh_noise=True, posterior=True)
    return r if raw_text else r.for_records()
