"""Your handlers live in this package (``SW_HANDLER_MODULE``, default ``functions.handlers``).

Loading the package must import every module that defines handlers, so each
``@handler`` registers. Replace the examples with your own modules.
"""

from __future__ import annotations

from .examples import charge, echo, sleepy, slow_report

__all__ = ["charge", "echo", "sleepy", "slow_report"]
