"""Drain Lambda: stop pulling, report draining, let in-flight jobs finish or hand them back, shut down."""

from aws_lambda_powertools import Logger

from serverless_worker.runtime.entry import drain_worker

logger = Logger()


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event, context):
    return drain_worker(event or {}, context)
