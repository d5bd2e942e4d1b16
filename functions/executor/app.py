"""Executor Lambda: one delivery (lease, run within budget, store outcome, report, ack)."""

from aws_lambda_powertools import Logger

from serverless_worker.runtime.entry import execute_delivery

logger = Logger()


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event, context):
    return execute_delivery(event, context)
