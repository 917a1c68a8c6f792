"""Utility under privacy: one bench, four subcommands (``python -m bench.utility …`` from the
repository root):

    table      Qu et al. 2021 Tables 4–7 in small, every mechanism (``bench.utility.table``)
    levers     the training recipe's levers through ``cloud-api train``'s path
               (``bench.utility.levers``)
    explore    one lever at a time on a seeded subset, driving ``models.training.finetune`` directly
               (``bench.utility.explore``)
    denoiser   the contextual denoiser: tokens recovered, and as an attack
               (``bench.utility.denoiser``)

Without a subcommand the first one, ``table``, runs (the bench's original command line).
"""
