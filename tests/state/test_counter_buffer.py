"""The counter buffer: counts of settled jobs reach the counters item in batches, at most
once per interval, instead of one DynamoDB write per job."""

from __future__ import annotations

from typing import Any

import pytest

from serverless_worker.runtime.counters import CounterBuffer
from serverless_worker.state import DynamoStateStore, StateStore


def _buffer(store: StateStore, clock: Any, every: float) -> CounterBuffer:
    return CounterBuffer(store, "pipelogiq", "blue", flush_seconds=every, clock=clock)


def test_counts_are_written_once_per_interval(store: StateStore, clock: Any) -> None:
    counters = _buffer(store, clock, 30)
    for _ in range(20):
        counters.add(processed=1)
    counters.add(processed=1, failed=1)

    assert store.ops["write"] == 0  # twenty-one settled jobs, not one write yet
    assert store.read_counters("pipelogiq", "blue") == {}
    assert counters.totals() == {"processed": 21, "failed": 1}

    clock.advance(30)
    counters.add(handed_back=1)  # the first count after the interval writes the whole batch

    assert store.ops["write"] == 1
    assert store.read_counters("pipelogiq", "blue") == {"processed": 21, "failed": 1, "handed_back": 1}
    assert counters.pending() == {}

    counters.add(processed=1)
    clock.advance(29)
    assert counters.flush_if_due() is False and store.ops["write"] == 1
    clock.advance(1)
    assert counters.flush_if_due() is True and store.ops["write"] == 2
    assert store.read_counters("pipelogiq", "blue")["processed"] == 22


def test_zero_interval_writes_every_count(store: StateStore, clock: Any) -> None:
    counters = _buffer(store, clock, 0)
    counters.add(processed=1)
    counters.add(processed=1, failed=1)

    assert store.ops["write"] == 2
    assert store.read_counters("pipelogiq", "blue") == {"processed": 2, "failed": 1}


def test_flush_writes_what_is_pending_and_read_adds_it(store: StateStore, clock: Any) -> None:
    store.add_counters("pipelogiq", "blue", processed=5)  # another container's earlier batch
    counters = _buffer(store, clock, 30)
    counters.add(processed=2, discarded=1)

    # What the heartbeat reports: stored totals plus this container's unwritten counts.
    assert counters.read() == {"processed": 7, "discarded": 1}
    assert counters.totals() == {"processed": 2, "discarded": 1}

    assert counters.flush() is True  # drain: written now, whatever the interval
    assert store.read_counters("pipelogiq", "blue") == {"processed": 7, "discarded": 1}
    assert counters.read() == {"processed": 7, "discarded": 1}  # not counted twice
    assert counters.flush() is False  # nothing left: no empty write
    assert store.ops["write"] == 2


def test_a_failed_write_keeps_the_counts_and_never_raises(ddb: Any, clock: Any) -> None:
    missing = DynamoStateStore("no-such-table", client=ddb, clock=clock)
    counters = _buffer(missing, clock, 0)

    counters.add(processed=1)  # the write fails; the settled job must not
    counters.add(processed=1, failed=1)

    assert missing.ops["write"] == 2
    assert counters.pending() == {"processed": 2, "failed": 1}
    assert counters.totals() == {"processed": 2, "failed": 1}


@pytest.mark.parametrize("deltas", [{"bad name": 1}, {"ttl": 1}, {"processed": 1.5}, {"processed": True}])
def test_bad_counts_are_refused_when_counted(store: StateStore, clock: Any, deltas: dict[str, Any]) -> None:
    counters = _buffer(store, clock, 0)
    with pytest.raises(ValueError):
        counters.add(**deltas)
    assert counters.totals() == {} and store.ops["write"] == 0
