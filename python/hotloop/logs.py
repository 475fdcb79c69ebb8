"""The server's log lines: their two formats, the ids they carry, and what they must
never carry.

Owns the logging configuration `hotloop serve` hands uvicorn (for its own loggers and
hotloop's), in two formats: `human` (uvicorn's, the default) and `json` (one object per
line: time, level, node, request_id, connection_id, response_id, event, message).
The ids come from context variables the transport binds (`bound`) for the duration of
an HTTP request or a WebSocket connection, or from a record's `extra`.

Neither format ever carries a secret or user content: every line passes `redact`
(Bearer credentials, the `authorization`/`cookie` headers, the configured API keys,
secret-looking query parameters), and the connection detail uvicorn and websockets print
at debug and trace level loses its headers and frames before it is formatted
(`ConnectionDetailFilter`). It does not decide what is logged where; the modules that
log do.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from websockets.frames import Frame

FORMATS = ("human", "json")
# The ids a line carries (None when unknown). The transport binds the first two for an
# HTTP request or a WebSocket connection; a response's id comes with its record.
ID_FIELDS = ("request_id", "connection_id", "response_id")
_BOUND: dict[str, ContextVar[str | None]] = {
    "request_id": ContextVar("request_id", default=None),
    "connection_id": ContextVar("connection_id", default=None),
}
# A request id a client (or its balancer) sent in `x-request-id` is kept when it is this
# tame; anything else is replaced, so a header cannot smuggle text into the logs.
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
REDACTED = "[redacted]"
SECRET_HEADERS = ("authorization", "cookie", "set-cookie", "proxy-authorization", "x-api-key")
# Each pattern with what a line must hold for it to match: a line per turn (ids and
# counts) holds none of them and skips the regular expressions, which were a fifth of
# its cost.
_SECRET_PATTERNS: tuple[tuple[Callable[[str], bool], re.Pattern[str]], ...] = (
    # `Bearer <token>` wherever it appears (a header echoed in an error, a trace line).
    (lambda text: "bearer" in text.lower(), re.compile(r"(?i)(bearer\s+)[^\s'\",;]+")),
    # Header pairs as ASGI scopes print them: (b'authorization', b'...').
    (
        lambda text: "'" in text or '"' in text,
        re.compile(rf"(?i)(b?['\"](?:{'|'.join(SECRET_HEADERS)})['\"],\s*)b?(['\"]).*?\2"),
    ),
    # Query parameters whose name says they hold a secret.
    (
        lambda text: "=" in text,
        re.compile(r"(?i)([?&][^=&\s]*(?:key|token|secret|password|auth)[^=&\s]*=)[^&\s'\"]+"),
    ),
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def request_id(sent: bytes | None) -> str:
    """The id of a request: the client's `x-request-id` when tame, else a new one."""
    if sent is not None:
        text = sent.decode("latin-1")
        if _CLIENT_REQUEST_ID.fullmatch(text):
            return text
    return new_id("req")


@contextmanager
def bound(**ids: str) -> Iterator[None]:
    """Lines logged inside (and by tasks started inside) carry these ids."""
    tokens = [(_BOUND[name], _BOUND[name].set(value)) for name, value in ids.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def bound_request_id() -> str:
    """The request id bound by the app (the one its log lines carry, answered as
    `x-request-id`); a new one for a request handled outside it (an app built by hand)."""
    return _BOUND["request_id"].get() or new_id("req")


def current_ids() -> dict[str, str | None]:
    """The bound ids, for work that logs later, outside this context."""
    return {name: var.get() for name, var in _BOUND.items()}


def redact(text: str, keys: Sequence[str] = ()) -> str:
    """`text` without credentials: the configured `keys`, and whatever the patterns
    recognise as one (also keys the server does not know: a wrong key is still one)."""
    for key in keys:
        if key:
            text = text.replace(key, REDACTED)
    for may_hold, pattern in _SECRET_PATTERNS:
        if may_hold(text):
            text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


_PLAIN = frozenset((str, int, float, bytes, type(None)))


class ConnectionDetailFilter(logging.Filter):
    """What uvicorn and websockets print about a connection at `debug` and `trace`: the
    handshake's headers one per line, every frame, every ASGI scope and message
    (hotloop's `send_frames` extension carries the streamed text). Credentials become
    `[redacted]`, frames, headers and query strings their sizes, as uvicorn already does
    for bodies."""

    HIDDEN = ("headers", "frames", "query_string")

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            if len(args) == 2 and str(args[0]).lower() in SECRET_HEADERS:
                record.args = (args[0], REDACTED)  # websockets' "< %s: %s" header lines
            elif self._holds_detail(args):
                # Only frames and mappings change: a line of ids and counts (one per
                # turn) keeps its tuple rather than paying for a copy of it.
                record.args = tuple(self._hide(arg) for arg in args)
        return True

    @staticmethod
    def _holds_detail(args: tuple[object, ...]) -> bool:
        """Whether a frame or a mapping is among `args`; the plain values of a line per
        request (the access line's, ids, counts) skip the abstract `Mapping` check."""
        for arg in args:
            if type(arg) not in _PLAIN and isinstance(arg, (Frame, Mapping)):
                return True
        return False

    def _hide(self, value: object) -> object:
        if isinstance(value, Frame):
            return f"<{value.opcode.name} frame, {len(value.data)} bytes>"
        if isinstance(value, Mapping):
            return {
                k: f"<{len(v)} {k}>" if k in self.HIDDEN and v is not None else v
                for k, v in value.items()
            }
        return value


class ContextFilter(logging.Filter):
    """Stamps every record with the node and the bound ids (a record's own `extra`
    wins), and with an `event` name: the record's own, else its logger's."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node
        for name in ID_FIELDS:
            if getattr(record, name, None) is None:
                var = _BOUND.get(name)
                setattr(record, name, None if var is None else var.get())
        if not getattr(record, "event", None):
            record.event = record.name
        return True


class RedactingFormatter(logging.Formatter):
    """Wraps the line's formatter; what it returns has passed `redact`."""

    def __init__(self, inner: logging.Formatter, keys: Sequence[str] = ()) -> None:
        super().__init__()
        self.inner = inner
        self.keys = tuple(keys)

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record), self.keys)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, the same fields on every line (null when unknown)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "node": getattr(record, "node", None),
            "pid": record.process,
            "logger": record.name,
            "event": getattr(record, "event", record.name),
            **{name: getattr(record, name, None) for name in ID_FIELDS},
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def _formatter(kind: str, log_format: str, keys: Sequence[str]) -> logging.Formatter:
    inner: logging.Formatter
    if log_format == "json":
        inner = JsonFormatter()
    else:
        human, access = _human_formatters()
        # The node's name on every line, so the logs of several nodes can be merged.
        inner = (
            access('%(levelprefix)s %(node)s %(client_addr)s - "%(request_line)s" %(status_code)s')
            if kind == "access"
            else human("%(levelprefix)s %(node)s %(message)s")
        )
    return RedactingFormatter(inner, keys)


def _record_copy(record: logging.LogRecord) -> logging.LogRecord:
    """A shallow copy of a record: its attributes, without `copy.copy`'s reduce protocol
    (which was a third of the cost of a line)."""
    copied = logging.LogRecord.__new__(logging.LogRecord)
    copied.__dict__.update(record.__dict__)
    return copied


@functools.cache
def _human_formatters() -> tuple[type[logging.Formatter], type[logging.Formatter]]:
    """uvicorn's formatters of the `human` format (default lines, access lines), their
    lines exactly uvicorn's, the record copied once and cheaply (`_record_copy`)."""
    # Imported here: uvicorn is only needed by the server, not by this module's users.
    from uvicorn._ansi import style as ansi_style
    from uvicorn.logging import AccessFormatter, ColourizedFormatter, DefaultFormatter

    def prefixed(formatter: ColourizedFormatter, record: logging.LogRecord) -> str:
        """uvicorn's `ColourizedFormatter.formatMessage` of a record copied already."""
        levelname = record.levelname
        separator = " " * (8 - len(levelname))
        if formatter.use_colors:
            levelname = formatter.color_level_name(levelname, record.levelno)
            if "color_message" in record.__dict__:
                record.msg = record.__dict__["color_message"]
                record.__dict__["message"] = record.getMessage()
        record.__dict__["levelprefix"] = levelname + ":" + separator
        return logging.Formatter.formatMessage(formatter, record)

    class Human(DefaultFormatter):
        def formatMessage(self, record: logging.LogRecord) -> str:
            return prefixed(self, _record_copy(record))

    class Access(AccessFormatter):
        def formatMessage(self, record: logging.LogRecord) -> str:
            """uvicorn's `AccessFormatter.formatMessage`, with one cheap copy."""
            copied = _record_copy(record)
            client_addr, method, full_path, http_version, status_code = copied.args  # type: ignore[misc]
            request_line = f"{method} {full_path} HTTP/{http_version}"
            if self.use_colors:
                request_line = ansi_style(request_line, bold=True)
            copied.__dict__.update(
                {
                    "client_addr": client_addr,
                    "request_line": request_line,
                    "status_code": self.get_status_code(int(status_code)),  # type: ignore[arg-type]
                }
            )
            return prefixed(self, copied)

    return Human, Access


def log_config(
    log_format: str, level: str, keys: Sequence[str] = (), node: str = ""
) -> dict[str, Any]:
    """The `logging.config.dictConfig` for uvicorn's `log_config`: uvicorn's loggers and
    hotloop's, in `log_format`, never printing `keys`. Plain data, so uvicorn's worker
    processes rebuild it."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    from uvicorn.config import LOG_LEVELS  # uvicorn's names, `trace` included

    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    levelno = LOG_LEVELS[level.lower()]
    filters = {
        "context": {"()": ContextFilter, "node": node or socket.gethostname()},
        "connection_detail": {"()": ConnectionDetailFilter},
    }

    def handler(kind: str, stream: str) -> dict[str, Any]:
        return {
            "class": "logging.StreamHandler",
            "formatter": kind,
            "filters": ["context", "connection_detail"],
            "stream": stream,
        }

    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": filters,
        "formatters": {
            kind: {"()": _formatter, "kind": kind, "log_format": log_format, "keys": list(keys)}
            for kind in ("default", "access")
        },
        "handlers": {
            "default": handler("default", "ext://sys.stderr"),
            "access": handler("access", "ext://sys.stdout"),
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
            "hotloop": {"handlers": ["default"], "level": levelno, "propagate": False},
        },
        # Any other library's warnings: the same handler, so json stays one object a line.
        "root": {"handlers": ["default"], "level": "WARNING"},
    }
