"""Fake AWS credentials for tests that run boto3 against moto: no profile, no endpoint,
so nothing can reach a real account or a stray local endpoint."""

from __future__ import annotations

import pytest

__all__ = ["use_fake_aws_credentials"]


def use_fake_aws_credentials(monkeypatch: pytest.MonkeyPatch, region: str) -> None:
    """Point boto3 at dummy credentials in ``region``, dropping any profile or endpoint."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"AWS_DEFAULT_REGION": region, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
