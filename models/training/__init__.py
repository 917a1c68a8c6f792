"""Fine-tuning on privatized payloads: data and collation (``data``, no torch), the recipe and
its levers, the channel posterior, objectives, the training loop (``finetune``), distributed
runs, offline experiments on labelled TSV or device records (``experiment``).
"""
