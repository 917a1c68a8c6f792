"""The bodies of the job routes, ``POST /admin/retrain`` and ``POST /admin/pretrain``: strict
pydantic models (``"epochs": "3"`` is a 422, not a guess). What is checked against the
database and the model home when a job is submitted is ``cloud_api.jobs.specs``.

FastAPI-free: the admin routes and tests build these directly.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from cloud_api.home import ID_PATTERN
from models.training.recipe import DEFAULT_EPOCHS
from shared.mechanisms.registry import dchi_names

Name = Annotated[str, Field(pattern=ID_PATTERN,
                            description="1-64 letters, digits, '_', '.', '-'")]


class RecipeRequest(BaseModel):
    """The training recipe of a retraining job (``models.training.recipe``). Device records carry no
    raw text, so the levers that need it are refused (422); ``posterior`` reads the channel
    posterior table of the promoted version (null: use it when there is one)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    posterior: bool | None = Field(None, description="channel-posterior inputs (dchi-text, "
                                   "dchi-embedding); null: when the promoted version has one")
    fresh_noise: bool = Field(False, description="needs raw public text: always refused here")
    denoise: float = Field(0.0, ge=0, allow_inf_nan=False,
                           description="needs the original tokens: refused unless 0")
    rtd: float = Field(0.0, ge=0, allow_inf_nan=False,
                       description="needs the original tokens: refused unless 0")
    distill: float = Field(0.0, ge=0, allow_inf_nan=False,
                           description="needs the original text: refused unless 0")
    warm_start: bool = Field(False, description="needs the original text: always refused here")
    denoiser: bool | None = Field(None, description="contextual channel-posterior inputs "
                                  "(dchi-text): the promoted version's denoiser, trained on "
                                  "public text (records cannot train one); null: when the "
                                  "promoted version has one")


class RetrainRequest(BaseModel):
    """Body of ``POST /admin/retrain``. Strict types: ``"promote": "yes"`` or ``"epochs":
    "3"`` is a 422, not a guess."""

    model_config = ConfigDict(extra="forbid", strict=True)
    task: Name = Field(description="the task whose records train the model")
    model_id: Name = Field(description="the model the new version is added to (created if new)")
    base: Name | None = Field(None, description="a pretrained base in $PRIVBERT_HOME/bases "
                              "(POST /admin/pretrain) of the task's bundle and mechanism; "
                              "default: the bundle's own BERT")
    epochs: int = Field(DEFAULT_EPOCHS, ge=1, le=100)
    lr: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False,
                             description="default 1e-4 (BERT reading token ids), 2e-5 "
                             "(BERT reading embeddings), 1e-3 (vector MLP)")
    batch_size: int | None = Field(None, ge=1, le=4096, description="default 32")
    promote: bool = Field(False, description="promote the new version unless its test "
                          "accuracy is worse than the promoted one's by more than one "
                          "binomial standard error")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="initialisation and "
                             "batch order only (never privatization)")
    recipe: RecipeRequest | None = Field(None, description="training levers; default: "
                                         "channel-posterior inputs when the promoted version "
                                         "has a table")


class PretrainRequest(BaseModel):
    """Body of ``POST /admin/pretrain``: privacy-adaptive pretraining on the public corpus
    (strict types, as the retrain body)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    objective: Literal["vanilla", "prob", "denoising"]
    mechanism: Literal[dchi_names()]  # type: ignore[valid-type]
    params: dict = Field(description='the mechanism\'s parameters, e.g. {"eta": 65}')
    steps: int = Field(ge=1, le=10_000_000)
    name: Name = Field(description="the base's name in $PRIVBERT_HOME/bases (new)")
    base: Name | None = Field(None, description="continue from this base; default the "
                              "MiniLM BERT")
    batch_size: int | None = Field(None, ge=1, le=4096)
    lr: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False)
    max_length: int | None = Field(None, ge=8, le=512)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
