"""Scheduler Lambda: one tick per scheduled event (session, heartbeats, pull, record, dispatch, reap)."""

import os

# No scan of installed packages for pydantic plugins on a cold start; a function that uses
# a plugin sets PYDANTIC_DISABLE_PLUGINS itself (to "" for all of them).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from aws_lambda_powertools import Logger

from serverless_worker.runtime.entry import scheduler_tick, tick_trigger
from serverless_worker.runtime.snapstart import install

logger = Logger()
# With SnapStart: prime the runtime for the snapshot and renew it after each restore.
install("scheduler")


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event, context):
    # Through Powertools' logger: in Lambda only it writes INFO lines (the package's own
    # loggers reach the runtime's root handler, which passes WARNING and above).
    logger.info("tick started", extra=tick_trigger(event))
    return scheduler_tick(event, context)
