"""Scheduler Lambda: one tick per scheduled event (session, heartbeats, pull, record, dispatch, reap)."""

from aws_lambda_powertools import Logger

from serverless_worker.runtime.entry import scheduler_tick

logger = Logger()


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event, context):
    return scheduler_tick(event, context)
