"""Attacks on privatized text: token inversion and vector attacks (``attack``), the contextual
denoiser that is both the channel posterior a model reads and the strongest attack
(``denoiser``, trained by ``denoiser_train``).
"""
