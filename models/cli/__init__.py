"""The training command lines (``cloud-api train``, ``cloud-api pretrain``): parse once, then
call ``models.training`` / ``models.pretraining``; ``flags``: the flags both share.
"""
