"""torch code: classifiers per payload kind, privacy-adaptive pretraining, fine-tuning, export.

Rooms: ``nets`` (networks), ``training`` (fine-tuning and its recipe), ``pretraining``,
``versions`` (version folders on disk), ``export``, ``attacks``, ``cli`` (the training
command lines).

Entry points (plain functions; the ``cloud-api`` subcommands are thin layers over them):

* ``models.training.experiment``: ``train_from_tsv``, ``train_from_records``, ``evaluate_tsv``,
  ``evaluate_records``
* ``models.versions.model_version``: ``load_model`` -> ``ModelVersion`` (``check_payload``,
  ``predict_proba``), ``save_model_version``
* ``models.export.writers``: ``export_bundle``, ``export_classifier_onnx``, ``OnnxClassifier``
  (defined in ``models.export.onnx_classifier``, which with ``models.training.data`` and
  ``models.versions.version_folder`` imports no torch: the onnx serving backend's modules)
* ``models.attacks.attack``: ``token_privacy``, ``vector_attack``
* ``models.training.finetune``: ``finetune``, ``TrainConfig``; ``models.training.data``:
  readers and collation
"""
