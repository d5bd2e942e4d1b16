"""Keep credentials out of what third-party libraries log: the one place that does it.

Two things, both applied when this module is imported (the protocol clients and the
modules that create boto3 clients import it):

- botocore logs every request and response at DEBUG: a GetSecretValue answer carries
  the API key, DynamoDB items carry session and delivery tokens, signed requests show
  the AWS session token. Its body loggers (``SDK_BODY_LOGGERS``) are held at INFO, and
  so is ``WIRE_LOGGER``, where the claim queue's work socket sends websockets' log
  (which shows the handshake's headers, bearer token included, and every frame).
- Whatever the level, every record of the loggers under ``REDACTED_LOGGERS`` (urllib3,
  requests, botocore, boto3, stamina, websockets and the wire logger) is redacted as it
  is made: credentials the clients registered with :func:`register_secret`,
  ``api_key=`` query values (urllib3 logs request URLs, and Priostack's query mode puts
  the key there) and credential headers become ``[redacted]``, in the message and in
  the traceback text.

The redaction is a log record factory rather than a logger filter: a filter sees only
the records of the logger it is on, not its children's, and botocore alone logs through
some thirty module loggers, created as its modules are imported.

The project's own records are not redacted (that would cost every log line a regex
pass), only their string arguments' control characters escaped (a job key or item id is
the server's text, logged as ``"job %s"``: one ``str.translate`` per argument); whatever
else a server says is made safe where it enters: every protocol
client passes a server's error text through :func:`server_text` before it goes into an
exception, a log line or the state store, and the stores pass every error text they
record through it again. A server may echo the request (its headers, its body) in an
error, and may put terminal escapes or line breaks in it to forge log lines.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "REDACTED",
    "REDACTED_LOGGERS",
    "MIN_SECRET_LENGTH",
    "SDK_BODY_LOGGERS",
    "WIRE_LOGGER",
    "hold_sdk_loggers",
    "install",
    "escape_controls",
    "escape_record_args",
    "redact",
    "redact_record",
    "register_secret",
    "server_text",
]

REDACTED = "[redacted]"
SDK_BODY_LOGGERS = ("botocore.endpoint", "botocore.parsers", "botocore.auth")
WIRE_LOGGER = "serverless_worker.protocols.claimqueue.wire"
# Each name with every logger below it.
REDACTED_LOGGERS = ("urllib3", "requests", "botocore", "boto3", "s3transfer", "stamina", "websockets",
                    WIRE_LOGGER)
_PREFIXES = tuple(f"{name}." for name in REDACTED_LOGGERS)
_OWN_PREFIX = "serverless_worker"  # the project's loggers: string arguments escaped (escape_record_args)

# Secrets that may appear in any shape: query values, credential headers, JSON token fields.
_PATTERNS = (
    re.compile(r"(api_key=)[^&\s\"']+", re.IGNORECASE),
    re.compile(r"((?:authorization|x-api-key|x-worker-session)['\"]?\s*[:=]\s*['\"]?(?:bearer\s+)?)"
               r"[^\s'\",}]+", re.IGNORECASE),
    re.compile(r"(\"(?:token|workerSessionToken|apiKey|api_key)\"\s*:\s*\")[^\"]+", re.IGNORECASE),
)

_secrets: set[str] = set()
_secrets_lock = threading.Lock()


# A shorter value cannot be told from ordinary text (a key "test" would cut every "test"
# out of every line); the shapes above still redact it where it stands as a credential.
MIN_SECRET_LENGTH = 8


def register_secret(value: str) -> None:
    """Redact ``value`` from the redacted loggers' records from now on (a client's credential)."""
    if len(value) >= MIN_SECRET_LENGTH:
        with _secrets_lock:
            _secrets.add(value)


def redact(text: str) -> str:
    """``text`` with every registered secret and every credential-shaped value cut out."""
    for pattern in _PATTERNS:
        text = pattern.sub(rf"\1{REDACTED}", text)
    with _secrets_lock:
        known = sorted(_secrets, key=len, reverse=True)  # longest first: one may contain another
    for secret in known:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


# C0 controls (NUL, CR, LF, ESC...), DEL and C1 controls (CSI 0x9b among them) as \xNN, the
# Unicode line and paragraph separators and the bidirectional overrides as \uNNNN: none
# may reach a terminal or a log line raw. A backslash is left as it is, so escaping is
# idempotent: a text the client escaped is escaped again, unchanged, by the state store.
_ESCAPES: dict[int, str] = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_ESCAPES.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})
_ESCAPES.update({code: f"\\u{code:04x}" for code in (0x2028, 0x2029, *range(0x202A, 0x202F),
                                                       *range(0x2066, 0x206A))})


def escape_controls(text: str) -> str:
    """``text`` with every control character written as an escape (``ESC`` as ``\\x1b``)."""
    return text.translate(_ESCAPES)


def server_text(text: str, secrets: tuple[str, ...] | list[str] = (), *, limit: int = 500) -> str:
    """What a server said (an error text), fit to log, raise or store: every registered and
    every given secret and every credential-shaped value cut out, control characters
    escaped, then cut to ``limit`` characters (after redacting, so no part of a secret is
    left at the cut). A given secret shorter than ``MIN_SECRET_LENGTH`` is cut out only
    where it stands as a credential, as a registered one is."""
    for secret in sorted((s for s in secrets if len(s) >= MIN_SECRET_LENGTH), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = escape_controls(redact(text))
    return text if len(text) <= limit else text[:limit] + "..."


def redact_record(record: logging.LogRecord) -> None:
    """Rewrite ``record``'s message, and its traceback text, with :func:`redact`."""
    try:
        message = record.getMessage()
    except (TypeError, ValueError):  # a malformed record: the handler reports it, unformatted
        return
    cleaned = redact(message)
    if cleaned != message:
        record.msg, record.args = cleaned, ()
    if record.exc_info and not record.exc_text:  # formatters reuse exc_text when it is set
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))


_make_record: Callable[..., logging.LogRecord] = logging.getLogRecordFactory()


def escape_record_args(record: logging.LogRecord) -> None:
    """Escape the control characters of ``record``'s string arguments: a job key or item id
    is the server's text too, and lands in the project's own lines as an argument
    (``"job %s ..."``); the format strings, which are ours, are left as written."""
    if isinstance(record.args, tuple) and any(isinstance(arg, str) for arg in record.args):
        record.args = tuple(escape_controls(arg) if isinstance(arg, str) else arg for arg in record.args)


def _redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record = _make_record(*args, **kwargs)
    if f"{record.name}.".startswith(_PREFIXES):
        redact_record(record)
    elif record.name.startswith(_OWN_PREFIX):
        escape_record_args(record)
    return record


def hold_sdk_loggers() -> None:
    """Raise each of ``SDK_BODY_LOGGERS`` and ``WIRE_LOGGER`` to INFO at least (they log
    bodies and headers only at DEBUG)."""
    for name in (*SDK_BODY_LOGGERS, WIRE_LOGGER):
        logger = logging.getLogger(name)
        if logger.level < logging.INFO:  # NOTSET (inherit) included
            logger.setLevel(logging.INFO)


def install() -> None:
    """Hold the body loggers and redact the third-party loggers' records (idempotent)."""
    global _make_record
    hold_sdk_loggers()
    current = logging.getLogRecordFactory()
    if current is not _redacting_factory:
        _make_record = current
        logging.setLogRecordFactory(_redacting_factory)


install()
