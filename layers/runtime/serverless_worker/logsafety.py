"""Keep credentials out of what the AWS SDK logs at DEBUG.

botocore logs every request and response at DEBUG: a GetSecretValue answer carries the
API key, DynamoDB requests and answers carry session and delivery tokens, and signed
requests show the AWS session token. Turning on DEBUG logging for the worker must never
print those, so the loggers that write bodies and signatures are held at INFO (the
claim queue's WebSocket wire log is held the same way). Importing this module does it;
the modules that create boto3 clients import it.
"""

from __future__ import annotations

import logging

__all__ = ["SDK_BODY_LOGGERS", "hold_sdk_loggers"]

SDK_BODY_LOGGERS = ("botocore.endpoint", "botocore.parsers", "botocore.auth")


def hold_sdk_loggers() -> None:
    """Raise each of ``SDK_BODY_LOGGERS`` to INFO at least (it logs bodies only at DEBUG)."""
    for name in SDK_BODY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.INFO:  # NOTSET (inherit) included
            logger.setLevel(logging.INFO)


hold_sdk_loggers()
