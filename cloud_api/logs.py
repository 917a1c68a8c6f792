"""Logging of ``cloud-api serve``: one JSON object per line (python-json-logger) on stderr.

Every line has ``time``, ``level``, ``logger`` and ``message``; request lines add
``request_id``, ``method``, ``route`` (the template), ``status``, ``duration_ms``, ``key_id``
and ``problem``. Nothing logs a body, a payload, a query string or a key. uvicorn's own
access log is off (its lines carry the raw path); its error log goes through the same
formatter. ``--workers N`` applies the same configuration in every worker process.
"""

from __future__ import annotations

import logging
import logging.config
import re

try:  # python-json-logger >= 3
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter
except ImportError:  # pragma: no cover - python-json-logger 2.x
    from pythonjsonlogger.jsonlogger import RESERVED_ATTRS, JsonFormatter

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
RENAME = {"asctime": "time", "levelname": "level", "name": "logger"}
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


class _ScrubbingJsonFormatter(_Scrubbing, JsonFormatter):
    pass


class _ScrubbingFormatter(_Scrubbing, logging.Formatter):
    pass


def json_formatter() -> logging.Formatter:
    """The JSON formatter (ISO-8601 times, renamed standard fields, database detail lines
    scrubbed)."""
    return _ScrubbingJsonFormatter(FORMAT, rename_fields=RENAME, timestamp=False,
                                   datefmt="%Y-%m-%dT%H:%M:%S%z",
                                   reserved_attrs=[*RESERVED_ATTRS, "color_message"])


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
