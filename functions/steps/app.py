"""State-machine steps Lambda: acquire, run_slice, renew, start/finish_callback, report, ack,
give_back, continue_as_new, chosen by the event's "step"."""

from aws_lambda_powertools import Logger

from serverless_worker.runtime.entry import state_machine_step

logger = Logger()


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event, context):
    return state_machine_step(event, context)
