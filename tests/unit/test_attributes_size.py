"""The SQLite backend sizes items on the Python values; it must agree, byte for byte, with
DynamoDB's size of the same item in wire form, or the two backends would refuse different
outcomes as too large."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from serverless_worker.state.items import attributes_size, attributes_size_bound, item_size, to_item

VALUES: list[Any] = [
    "", "plain", "ünïcødé ✓", "x" * 5000, 0, 1, -1, 7, 10, 12345678901234567890, -98765,
    0.5, -2.25, 1e-07, 1e16, 3.141592653589793, 100.0, Decimal("12.3400"), Decimal("-0.001"),
    True, False, b"\x00\x01bytes", [], {}, [1, "a", None, True], {"k": None, "n": 3, "s": "v"},
    {"nested": {"deeper": [Decimal("1.5"), {"x": "y"}], "empty": []}}, {"ß": "é"}, {1, 2, 3}, {"a", "bc"},
]


@pytest.mark.parametrize("value", VALUES, ids=[f"{i}-{type(v).__name__}" for i, v in enumerate(VALUES)])
def test_one_attribute_is_sized_as_dynamodb_sizes_it(value: Any) -> None:
    attributes = {"pk": "delivery#pipelogiq#1", "value": value}
    assert attributes_size(attributes) == item_size(to_item(attributes))


def test_a_ledger_like_item_and_absent_attributes() -> None:
    attributes = {"pk": "delivery#claimqueue#abc", "sk": "delivery", "status": "RUNNING", "attempt": 2,
                  "due": 1796235427.1013024, "payload": '{"url": "https://ex.com/a.png"}', "ttl": None,
                  "outcome": {"kind": "success", "value": {"ok": True, "items": [1, 2, 3]}}}
    assert attributes_size(attributes) == item_size(to_item(attributes))


@pytest.mark.parametrize("value", VALUES, ids=[f"{i}-{type(v).__name__}" for i, v in enumerate(VALUES)])
def test_the_cheap_bound_is_never_below_the_size(value: Any) -> None:
    # the store skips the exact count when the bound is under the limit, so it must never undercount
    attributes = {"pk": "delivery#pipelogiq#1", "välue": value, "absent": None}
    assert attributes_size_bound(attributes) >= attributes_size(attributes)


def test_the_bound_of_the_longest_number_and_widest_characters_holds() -> None:
    attributes = {"n": Decimal("-1.2345678901234567890123456789012345678E-120"), "s": "\U0001f600" * 100}
    assert attributes_size_bound(attributes) >= attributes_size(attributes) == item_size(to_item(attributes))
