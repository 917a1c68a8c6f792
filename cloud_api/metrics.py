"""Prometheus collectors (prometheus-client), named after text-embeddings-inference's
``te_*`` set with a ``privbert_`` prefix, so dashboards and alerts operators already
have carry over. One place for every metric of the service; labels never carry
payload data or keys (a key appears only as its short id, and not here at all).

``cloud-api serve --workers N`` (N > 1) runs prometheus-client's multiprocess mode: the
parent makes a private directory and names it in ``PROMETHEUS_MULTIPROC_DIR`` before the
processes start; each process keeps its values in files there, and :func:`exposition` adds up
the files of every process, so a scrape shows the whole server whichever process answers it.
Only counters, histograms and gauges are used (``Summary`` has no quantiles, ``Info`` and
``Enum`` do not work in that mode); every gauge says how its processes' values combine.
Without the variable (one process) the default registry serves, as before.
"""

from __future__ import annotations

import glob
import os

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKENS = (16, 64, 256, 1024, 4096, 16384, 65536)

# -- requests (te_request_count / te_request_success / te_request_failure) -------------------
REQUESTS = Counter("privbert_request", "HTTP requests answered, by route template and status",
                   ["route", "method", "status"])
FAILURES = Counter("privbert_request_failure", "Failed requests by kind of error "
                   "(validation, payload-mismatch, overloaded, rate-limited, unauthorized, "
                   "forbidden, not-found, unavailable, inference, too-large, ...)", ["err"])
REQUEST_DURATION = Histogram("privbert_request_duration_seconds", "Whole request time",
                             ["route"], buckets=_LATENCY)
# gauges: "livesum" adds up what each live process has now (a process that exits leaves it);
# "livemax" for 0/1 flags: 1 while at least one live process holds it
IN_FLIGHT = Gauge("privbert_requests_in_flight", "Requests being handled now",
                  multiprocess_mode="livesum")

# -- batching and inference (te_queue_size, te_batch_*, te_request_inference_duration) -------
QUEUE_SIZE = Gauge("privbert_queue_size", "Payloads waiting in a version's batch queue",
                   ["model", "version"], multiprocess_mode="livesum")
QUEUE_DURATION = Histogram("privbert_request_queue_duration_seconds", "Time a payload waited "
                           "in the queue before its batch ran", ["model"], buckets=_LATENCY)
INFERENCE_DURATION = Histogram("privbert_batch_inference_duration_seconds", "Model forward "
                               "time of one batch", ["model"], buckets=_LATENCY)
BATCH_SIZE = Histogram("privbert_batch_size", "Payloads per model forward", ["model"],
                       buckets=_BATCH)
BATCH_TOKENS = Histogram("privbert_batch_tokens", "Padded tokens per model forward",
                         ["model"], buckets=_TOKENS)
# livemax, not livesum: the value stays the 0/1 that alerts test (== 1) whatever N is, and
# is 1 while any process serves the version, as during a promotion, when the processes switch
# one after the other within PRIVBERT_RELOAD_INTERVAL_S (an old version still answers
# some requests until the last process has let it go); not liveall, whose pid label would
# make N series of one version
LOADED = Gauge("privbert_model_loaded", "1 for each model version loaded and serving",
               ["model", "version"], multiprocess_mode="livemax")
LOAD_FAILURES = Counter("privbert_model_load_failure", "Model versions that failed to load",
                        ["model"])
# PRIVBERT_MODEL_STORE=database: seconds since the replica last read the store's promotions
# whole (cloud_api.serving.model_sync); a value past a few sync intervals is worth an alert
MODEL_SYNC_AGE = Gauge("privbert_model_store_sync_age_seconds", "Seconds since the "
                       "promotions in the shared model store were last read",
                       multiprocess_mode="livemax")
FALLBACKS = Counter("privbert_model_fallback", "Times a model served an older version that "
                    "verifies because its promoted version could not be loaded (not whole, "
                    "laundered, non-finite) while nothing of it was served", ["model", "version"])
NONFINITE = Counter("privbert_predictions_nonfinite", "Payloads whose scores came out NaN or "
                    "infinite (never answered: the request gets a 500 non-finite-scores and "
                    "its charge is refunded)", ["model", "version"])

# -- records and jobs -------------------------------------------------------------------------
RECORDS = Counter("privbert_records_ingested", "Labelled privatized records stored", ["task"])
JOBS = Counter("privbert_jobs_finished", "Jobs that ended, by kind and state",
               ["kind", "state"])

# -- privacy budget ledgers (cloud_api.store.budgets) ------------------------------------------
PRIVACY_SPENT = Counter("privbert_privacy_spent_epsilon", "Worst-case epsilon charged to the "
                        "privacy budget ledgers, by family and route (records, predict)",
                        ["family", "route"])
PRIVACY_PAYLOADS = Counter("privbert_privacy_charged_payloads", "Payloads charged to the "
                           "privacy budget ledgers, by family and route", ["family", "route"])
BUDGET_EXHAUSTED = Counter("privbert_budget_exhausted", "Requests refused because they would "
                           "pass a ledger's cap (nothing stored, no prediction)", ["route"])
PRIVACY_REFUNDS = Counter("privbert_privacy_refunds", "Prediction charges refunded because "
                          "the request got no answer, by reason", ["reason"])


def multiprocess_dir() -> str | None:
    """The directory of multiprocess mode (``--workers N``), None with one process."""
    return os.environ.get(MULTIPROC_ENV) or None


def exposition(path: str | None = None) -> bytes:
    """The text of ``/metrics``: the default registry with one process; with a multiprocess
    directory (``path``, default :func:`multiprocess_dir`), the sum over every process's
    files, counters and histograms of exited processes included (a counter never goes back),
    gauges of live processes only."""
    path = path or multiprocess_dir()
    if path is None:
        return generate_latest(REGISTRY)
    _forget_dead_processes(path)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path)
    return generate_latest(registry)


def _forget_dead_processes(path: str) -> None:
    """Drop the live gauges of processes that are gone without :func:`mark_process_dead`
    (killed: OOM, or uvicorn's supervisor killing a hung process)."""
    for file in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        pid = file.rsplit("_", 1)[-1][:-3]
        if pid.isdigit() and not _alive(int(pid)):
            mark_process_dead(int(pid), path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        pass
    return True


def forget_process(pid: int | None = None) -> None:
    """At a process's exit (multiprocess mode): its live gauges leave the sums; its
    counters and histograms stay."""
    path = multiprocess_dir()
    if path is not None:
        mark_process_dead(os.getpid() if pid is None else pid, path)


def drop_series(gauge: Gauge, *labelvalues: str) -> None:
    """Remove one labelled series of ``gauge`` (a version unloaded). Multiprocess mode
    cannot remove a series from a process's file, so there it is set to 0 instead (and
    stays listed with 0)."""
    if multiprocess_dir() is not None:
        gauge.labels(*labelvalues).set(0)
    else:
        gauge.remove(*labelvalues)
