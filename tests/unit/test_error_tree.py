"""Every error the runtime raises lives in the one error tree (``serverless_worker.errors``);
the modules that raise them still hand the names on for their callers."""

from __future__ import annotations

import pytest

from serverless_worker import errors
from serverless_worker.runtime import dispatch, session


@pytest.mark.parametrize(("module", "name"), [(dispatch, "DispatchError"), (session, "SessionUnavailableError")])
def test_a_runtime_error_is_the_error_trees_own(module: object, name: str) -> None:
    tree_error = getattr(errors, name)
    assert name in errors.__all__
    assert getattr(module, name) is tree_error
    assert issubclass(tree_error, errors.ServerlessWorkerError)
    assert tree_error.__module__ == "serverless_worker.errors"
