"""Executor Lambda: one delivery (lease, run within budget, store outcome, report, ack)."""

import os

# No scan of installed packages for pydantic plugins on a cold start; a function that uses
# a plugin sets PYDANTIC_DISABLE_PLUGINS itself (to "" for all of them).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from aws_lambda_powertools import Logger

from serverless_worker.runtime.entry import execute_delivery
from serverless_worker.runtime.snapstart import install

logger = Logger()
# With SnapStart: prime the runtime for the snapshot and renew it after each restore.
install("executor")


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event, context):
    return execute_delivery(event, context)
