"""The service's errors, free of the web framework.

Modules below the HTTP layer (``serving/``, ``store/``, ``jobs/``) raise these;
``cloud_api.problems`` turns each into an RFC 9457 problem+json answer whose ``type``
is the stable URI of its ``kind``. A ``detail`` never repeats payload data or keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PROBLEM_BASE = "urn:privbert:problem:"


def problem_type(kind: str) -> str:
    """The stable ``type`` URI of a kind of error, e.g. ``urn:privbert:problem:validation``."""
    return PROBLEM_BASE + kind


class ServiceError(Exception):
    """An error with an HTTP status, a stable kind and one line of detail."""

    status = 500
    kind = "internal"
    title = "Internal error"

    def __init__(self, detail: str, *, retry_after: float | None = None,
                 errors: Sequence[Mapping[str, Any]] | None = None,
                 headers: dict[str, str] | None = None, extra: dict | None = None):
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after
        self.errors = errors  # structured validation errors, never with input values
        self.headers = headers  # extra response headers
        self.extra = extra  # extension members of the problem (RFC 9457 §3.2)


class InvalidRequest(ServiceError):
    status, kind, title = 422, "validation", "Invalid request"


class PayloadMismatch(InvalidRequest):
    """A payload made for another mechanism, parameters, bundle or dimension."""

    kind, title = "payload-mismatch", "Payload does not match the model"


class WeakPrivacy(InvalidRequest):
    """Mechanism parameters weaker than the privacy floor (``shared.floor``)."""

    kind, title = "weak-privacy", "Weaker than the privacy floor"


class NotFound(ServiceError):
    status, kind, title = 404, "not-found", "Not found"


class Conflict(ServiceError):
    status, kind, title = 409, "conflict", "Conflict"


class Overloaded(ServiceError):
    """Queue full, too many concurrent requests, or a key over its rate (429)."""

    status, kind, title = 429, "overloaded", "Too many requests"


class RateLimited(Overloaded):
    kind, title = "rate-limited", "Rate limit exceeded"


class Unavailable(ServiceError):
    """Queue timeout, a model not loaded, the database unreachable (503)."""

    status, kind, title = 503, "unavailable", "Service unavailable"


class InsufficientStorage(ServiceError):
    """The database (or the disk under it) is full: nothing of the request was stored (507,
    RFC 4918 §11.5). Not an outage: retrying soon will not help until space is freed."""

    status, kind, title = 507, "insufficient-storage", "Insufficient storage"


class TooManyPayloads(ServiceError):
    """More payloads in one request than a limit allows (413); the detail names it."""

    status, kind, title = 413, "too-many-payloads", "Too many payloads in one request"


class InferenceFailed(ServiceError):
    status, kind, title = 500, "inference", "Inference failed"


class NonFiniteScores(InferenceFailed):
    """The model answered NaN or an infinity for a payload (its files are corrupt, or its
    training diverged): never answered as a prediction, and the charge is refunded."""

    kind, title = "non-finite-scores", "The model gave non-finite scores"
