"""What the Lambda layer leaves out of the package (layers/runtime/Makefile's DEV_TOOLING),
paths relative to ``serverless_worker``: the tests hold the recipe and the build to it."""

from __future__ import annotations

LEFT_OUT_OF_LAYER = frozenset({
    "sandbox", "local", "cli", "stack.py",   # the sandboxes, the local runner, the CLI, its template reader
    "testing.py",                            # the handler test kit
    "state/sqlite_store.py", "state/group_commit.py",  # the local runner's state backend
    "protocols/claimqueue_socket.py",        # the work socket: needs websockets, which the layer lacks
})
