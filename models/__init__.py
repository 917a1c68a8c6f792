"""torch code: classifiers per payload kind, privacy-adaptive pretraining, fine-tuning, export.

Entry points (plain functions; the ``cloud-api`` subcommands are thin layers over them):

* ``models.experiment``: ``train_from_tsv``, ``train_from_records``, ``evaluate_tsv``,
  ``evaluate_records``
* ``models.versions``: ``load_model`` -> ``ModelVersion`` (``check_payload``,
  ``predict_proba``), ``save_model_version``
* ``models.export``: ``export_bundle``, ``export_classifier_onnx``, ``OnnxClassifier``
  (defined in ``models.onnx_classifier``, which with ``models.data`` and
  ``models.version_folder`` imports no torch: the onnx serving backend's modules)
* ``models.attack``: ``token_privacy``, ``vector_attack``
* ``models.finetune``: ``finetune``, ``TrainConfig``; ``models.data``: readers and collation
"""
