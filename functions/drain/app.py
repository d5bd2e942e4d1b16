"""Drain Lambda: stop pulling, report draining, let in-flight jobs finish or hand them back, shut down."""

import os

# No scan of installed packages for pydantic plugins on a cold start; a function that uses
# a plugin sets PYDANTIC_DISABLE_PLUGINS itself (to "" for all of them).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from aws_lambda_powertools import Logger

from serverless_worker.runtime.entry import drain_worker
from serverless_worker.runtime.snapstart import install

logger = Logger()
# With SnapStart: prime the runtime for the snapshot and renew it after each restore.
install("drain")


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event, context):
    return drain_worker(event or {}, context)
