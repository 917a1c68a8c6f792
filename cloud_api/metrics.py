"""Prometheus collectors (prometheus-client), named after text-embeddings-inference's
``te_*`` set with a ``privbert_`` prefix, so dashboards and alerts operators already
have carry over. One place for every metric of the service; labels never carry
payload data or keys (a key appears only as its short id, and not here at all).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
IN_FLIGHT = Gauge("privbert_requests_in_flight", "Requests being handled now")

# -- batching and inference (te_queue_size, te_batch_*, te_request_inference_duration) -------
QUEUE_SIZE = Gauge("privbert_queue_size", "Payloads waiting in a version's batch queue",
                   ["model", "version"])
QUEUE_DURATION = Histogram("privbert_request_queue_duration_seconds", "Time a payload waited "
                           "in the queue before its batch ran", ["model"], buckets=_LATENCY)
INFERENCE_DURATION = Histogram("privbert_batch_inference_duration_seconds", "Model forward "
                               "time of one batch", ["model"], buckets=_LATENCY)
BATCH_SIZE = Histogram("privbert_batch_size", "Payloads per model forward", ["model"],
                       buckets=_BATCH)
BATCH_TOKENS = Histogram("privbert_batch_tokens", "Padded tokens per model forward",
                         ["model"], buckets=_TOKENS)
LOADED = Gauge("privbert_model_loaded", "1 for each model version loaded and serving",
               ["model", "version"])
LOAD_FAILURES = Counter("privbert_model_load_failure", "Model versions that failed to load",
                        ["model"])

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
