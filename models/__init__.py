"""torch code: classifiers per payload kind, privacy-adaptive pretraining, fine-tuning, export."""
