"""One owner per retry (docs/retries.md): the errors that reach the runtime only after the
layer that owns their retry has given up on them.

The protocol client retries a transient failure of the job server (5xx, a lost answer,
429) under its ``RetryPolicy``; botocore retries a throttled or failing AWS call in its
standard mode. What either raises has been retried already for as long as the call could
afford, so no state machine ``Retry`` tries the same call again: a settling call the client
gave up on is noted on its ledger item, where the reaper takes it up at the noted time
(and the executor ends without raising it, so Lambda's asynchronous retry does not send it
again either); anything else ends in its step's give-back or at the item's deadline. Outer
layers keep what only they can see: a Lambda invocation that failed, crashed or timed out.

    except CLIENT_RETRIED: ...   # the client gave up: note it for the reaper, do not raise it to Lambda
    RETRIED_INSIDE_NAMES         # what no state machine Retry may retry again
"""

from __future__ import annotations

from ..errors import DispatchError, RateLimitedError, ServerUnavailableError
from ..state.errors import StateStoreError

__all__ = ["CLIENT_RETRIED", "CLIENT_RETRIED_NAMES", "RETRIED_INSIDE", "RETRIED_INSIDE_NAMES", "SDK_RETRIED"]

# The protocol client's RetryPolicy retries these (protocols/factory.py builds it).
CLIENT_RETRIED: tuple[type[Exception], ...] = (ServerUnavailableError, RateLimitedError)
# As Lambda names them to Step Functions (the exception's class name).
CLIENT_RETRIED_NAMES: frozenset[str] = frozenset(cls.__name__ for cls in CLIENT_RETRIED)
# botocore's standard retry mode retries the AWS calls behind these (state/store.py,
# awsclients.py); what is left is a call that failed after its own retries.
SDK_RETRIED: tuple[type[Exception], ...] = (StateStoreError, DispatchError)
RETRIED_INSIDE: tuple[type[Exception], ...] = CLIENT_RETRIED + SDK_RETRIED
RETRIED_INSIDE_NAMES: frozenset[str] = frozenset(cls.__name__ for cls in RETRIED_INSIDE)
