"""Serving core, free of the web framework: edge bundles, inference backends, the
micro-batcher and the registry of served model versions with hot swap."""

from cloud_api.serving.bundles import BundleStore
from cloud_api.serving.registry import Prediction, ServingRegistry

__all__ = ["BundleStore", "Prediction", "ServingRegistry"]
