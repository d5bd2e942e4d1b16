"""DynamoDB's Time to Live, emulated for the embedded table.

DynamoDB deletes an item some time after its ``ttl`` (epoch seconds) has passed; moto
never does (docs/moto-notes.md, section 5), so a long local run kept every settled
ledger item it ever wrote: memory grew with every job, without a bound. ``TtlSweeper``
deletes expired items every ``interval`` seconds on a small daemon thread. Each delete
is conditional on the item still being expired, so an item rewritten since the scan (a
redelivery recorded again over a settled one) stays. As in DynamoDB, an expired item may
linger up to one interval; the store already treats such items as absent.

Example::

    sweeper = TtlSweeper(aws.dynamodb, aws.table_name, interval=60).start()
    ...
    sweeper.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ..state.keys import PK, SK, TTL

__all__ = ["TtlSweeper"]

log = logging.getLogger("serverless_worker.local")


class TtlSweeper:
    """Deletes items of ``table`` whose ``ttl`` is before ``clock()``; ``on_deleted`` gets
    the partition keys of each sweep's deleted items (the runner forgets their ledger ids)."""

    def __init__(self, client: Any, table: str, *, interval: float = 60.0,
                 clock: Callable[[], float] = time.time,
                 on_deleted: Callable[[list[str]], None] | None = None) -> None:
        self._client = client
        self._table = table
        self._interval = interval
        self._clock = clock
        self._on_deleted = on_deleted
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.deleted = 0  # items deleted by this sweeper, in total

    def sweep(self) -> int:
        """One pass over the table; returns how many expired items it deleted."""
        now = int(self._clock())
        deleted: list[str] = []
        pages = self._client.get_paginator("scan").paginate(
            TableName=self._table, ProjectionExpression="#pk, #sk", FilterExpression="#ttl < :now",
            ExpressionAttributeNames={"#pk": PK, "#sk": SK, "#ttl": TTL},
            ExpressionAttributeValues={":now": {"N": str(now)}})
        for page in pages:
            for key in page.get("Items", []):
                if self._halt.is_set():
                    break
                try:
                    self._client.delete_item(
                        TableName=self._table, Key=key, ConditionExpression="#ttl < :now",
                        ExpressionAttributeNames={"#ttl": TTL}, ExpressionAttributeValues={":now": {"N": str(now)}})
                except ClientError as err:
                    if err.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                        raise
                    continue  # rewritten since the scan: live again
                deleted.append(key[PK]["S"])
        self.deleted += len(deleted)
        if deleted and self._on_deleted is not None:
            self._on_deleted(deleted)
        return len(deleted)

    def start(self) -> TtlSweeper:
        self._thread = threading.Thread(target=self._run, name="ttl-sweeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._halt.wait(self._interval):
            try:
                self.sweep()
            except (BotoCoreError, ClientError) as err:  # the next interval tries again
                log.warning("TTL sweep of the embedded table failed: %s", type(err).__name__)
