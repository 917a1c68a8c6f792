"""Privacy mechanisms: pure numpy, vectorised, exact samplers of the published distributions.

Every ``privatize``/``perturb``/``encrypt`` takes ``rng``: a passed
``numpy.random.Generator`` is used as is; ``None`` draws fresh OS entropy.
"""

from shared.mechanisms.binary import OME, OUE, SUE, z_score
from shared.mechanisms.dchi import DChiEmbedding, DChiText, sample_dchi_noise
from shared.mechanisms.laplace import Laplace, dropout_epsilon, min_max_scale
from shared.mechanisms.nearest import ExactNearest
from shared.mechanisms.texthide import TextHide

__all__ = [
    "OME",
    "OUE",
    "SUE",
    "DChiEmbedding",
    "DChiText",
    "ExactNearest",
    "Laplace",
    "TextHide",
    "dropout_epsilon",
    "min_max_scale",
    "sample_dchi_noise",
    "z_score",
]
