"""Privacy mechanisms: pure numpy, vectorised, exact samplers of the published distributions.

Every ``privatize``/``perturb``/``encrypt`` takes ``rng``: a passed
``numpy.random.Generator`` is used as is; ``None`` draws fresh OS entropy.

Each mechanism is a class registered by name below (``shared.mechanisms.registry``: the
``Mechanism`` protocol and the factory ``create``); its module holds its sampler and
registers its cost, floor and guarantee. Adding one is its file plus one line here.
"""

from shared.mechanisms.binary import OME, OUE, SUE, z_score
from shared.mechanisms.dchi import DChiEmbedding, DChiText, sample_dchi_noise
from shared.mechanisms.laplace import Laplace, dropout_epsilon, min_max_scale
from shared.mechanisms.nearest import ExactNearest
from shared.mechanisms.plain import NoPrivacy
from shared.mechanisms.registry import (
    BaseMechanism,
    Mechanism,
    PayloadKind,
    as_mechanism,
    create,
    get,
    register,
)
from shared.mechanisms.texthide import TextHide

# the registry, in the order the CLIs list the mechanisms
register(NoPrivacy)
register(DChiText)
register(DChiEmbedding)
register(Laplace)
register(OME)
register(TextHide)

__all__ = [
    "OME",
    "OUE",
    "SUE",
    "DChiEmbedding",
    "DChiText",
    "ExactNearest",
    "BaseMechanism",
    "Laplace",
    "Mechanism",
    "NoPrivacy",
    "PayloadKind",
    "TextHide",
    "as_mechanism",
    "create",
    "dropout_epsilon",
    "get",
    "min_max_scale",
    "register",
    "sample_dchi_noise",
    "z_score",
]
