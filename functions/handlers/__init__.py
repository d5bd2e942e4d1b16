"""Your handlers live in this package (``SW_HANDLER_MODULE``, default ``functions.handlers``).

Every module in this package is loaded with it (names starting with ``_`` excepted), so
a new file here registers its ``@handler`` functions without an import below; a module
that registers none is named in a warning (name a helper ``_helpers.py``, or put it beside
the package in ``functions/``, the code root, and ``import`` it by name). Replace the
examples with your own modules.
"""

from __future__ import annotations

from .examples import charge, echo, sleepy, slow_report

__all__ = ["charge", "echo", "sleepy", "slow_report"]
