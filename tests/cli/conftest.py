"""CLI tier fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.local_aws import LocalAws, local_aws_server


@pytest.fixture
def local_aws() -> Iterator[LocalAws]:
    """moto's server on loopback with the stack's table and executor, fresh for each test."""
    with local_aws_server() as aws:
        yield aws
