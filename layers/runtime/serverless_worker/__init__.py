"""serverless-worker: run job handlers for HTTP job-worker APIs on AWS Lambda."""

from __future__ import annotations

from .errors import BusinessError, ServerlessWorkerError

__all__ = ["BusinessError", "ServerlessWorkerError"]
__version__ = "0.1.0"
