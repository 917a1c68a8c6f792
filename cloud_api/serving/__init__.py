"""Serving core, free of the web framework: edge bundles, inference backends, the
micro-batcher and the served model versions with hot swap."""

from cloud_api.serving.bundles import BundleStore
from cloud_api.serving.hot_swap import Prediction, ServedModels

__all__ = ["BundleStore", "Prediction", "ServedModels"]
