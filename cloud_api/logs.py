"""Logging of ``cloud-api serve``: one JSON object per line on stderr.

Every line has ``time``, ``level``, ``logger`` and ``message``; request lines add
``request_id``, ``method``, ``route`` (the template), ``status``, ``duration_ms``, ``key_id``
and ``problem``; a traceback comes as ``exc_info``. Nothing logs a body, a payload, a query
string or a key. uvicorn's own access log is off (its lines carry the raw path); its error
log goes through the same formatter. ``--workers N`` applies the same configuration in
every worker process.

The JSON formatter is ours (orjson; python-json-logger's, which wrote the same fields,
cost several times the CPU): every predict writes an access line, so the formatter is on
the hot path (``bench/serve.py`` measures it).
"""

from __future__ import annotations

import logging
import logging.config
import re
import time

import orjson

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


# The database server's own detail lines of an error message: PostgreSQL's "Failing row
# contains (...)" carries a whole row, payload bytes as hex included; "Key (...)=(...)"
# carries key values. They are dropped from every logged message and traceback.
_DB_DETAIL = re.compile(r"^\s*(DETAIL|CONTEXT|HINT|WHERE):.*(?:\n|$)", re.MULTILINE)


def scrub(text: str) -> str:
    """``text`` without the database's DETAIL / CONTEXT / HINT / WHERE lines."""
    return _DB_DETAIL.sub("", text)


class _Scrubbing(logging.Formatter):
    """Formats a copy of the record whose message is scrubbed, and scrubbed tracebacks."""

    def format(self, record: logging.LogRecord) -> str:
        clean = logging.makeLogRecord(record.__dict__)  # other handlers keep the original
        clean.msg, clean.args, clean.exc_text = scrub(record.getMessage()), None, None
        return super().format(clean)

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return scrub(super().formatException(ei))


class _ScrubbingFormatter(_Scrubbing, logging.Formatter):
    pass


# attributes of every LogRecord (and what formatters add): not "extra" fields
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message", "asctime", "color_message", "taskName"}
DATEFMT = "%Y-%m-%dT%H:%M:%S%z"


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, local zone, to the second),
    ``level``, ``logger``, ``message`` (database detail lines scrubbed), every ``extra``
    field, ``exc_info`` / ``stack_info`` (scrubbed) when present."""

    def __init__(self):
        super().__init__()
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # one strftime per second, not per line
            self._second, self._stamp = second, time.strftime(DATEFMT,
                                                              time.localtime(second))
        out = {"time": self._stamp, "level": record.levelname, "logger": record.name,
               "message": scrub(record.getMessage())}
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = scrub(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exc_info"] = scrub(record.exc_text)
        if record.stack_info:
            out["stack_info"] = scrub(self.formatStack(record.stack_info))
        return orjson.dumps(out, default=str).decode()


def json_formatter() -> logging.Formatter:
    """The JSON formatter (:class:`JsonLineFormatter`)."""
    return JsonLineFormatter()


def plain_formatter() -> logging.Formatter:
    """The plain-text formatter (``json=False``), scrubbed the same way."""
    return _ScrubbingFormatter(PLAIN_FORMAT)


def logging_config(level: str = "INFO", json: bool = True) -> dict:
    """A ``logging.config.dictConfig`` for the service and uvicorn (``uvicorn.run(
    log_config=...)`` applies it in each worker process)."""
    formatter = {"()": "cloud_api.logs.json_formatter" if json
                 else "cloud_api.logs.plain_formatter"}
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "default",
                                "stream": "ext://sys.stderr"}},
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            "uvicorn": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.access": {"handlers": [], "level": "CRITICAL", "propagate": False},
            "alembic": {"handlers": [], "level": "WARNING", "propagate": True},  # migrations
        },
    }


def configure(level: str = "INFO", json: bool = True) -> None:
    """Apply :func:`logging_config` in this process."""
    logging.config.dictConfig(logging_config(level, json))
