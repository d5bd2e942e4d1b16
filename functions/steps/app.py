"""State-machine steps Lambda: acquire, run_slice, renew, start/finish_callback, report, ack,
give_back, continue_as_new, chosen by the event's "step"."""

import os

# No scan of installed packages for pydantic plugins on a cold start; a function that uses
# a plugin sets PYDANTIC_DISABLE_PLUGINS itself (to "" for all of them).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from aws_lambda_powertools import Logger

from serverless_worker.runtime.entry import state_machine_step
from serverless_worker.runtime.snapstart import install

logger = Logger()
# With SnapStart: prime the runtime for the snapshot and renew it after each restore.
install("steps")


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event, context):
    return state_machine_step(event, context)
