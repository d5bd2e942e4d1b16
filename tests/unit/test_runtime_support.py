"""The stack never names a Lambda runtime that is deprecated or about to be.

Lambda blocks creating functions on a runtime a month after its deprecation date and
updating them two months after, so a stack on such a runtime cannot be deployed. Every
runtime in template.yaml (the functions' and the layer's) must be listed in
docs/lambda-python-runtimes.md and at least 12 months from its deprecation date.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from support.template import TEMPLATE_PATH, load_template

TABLE = TEMPLATE_PATH.parent / "docs" / "lambda-python-runtimes.md"
MARGIN_DAYS = 365


def deprecation_dates(path: Path = TABLE) -> dict[str, dt.date]:
    """runtime -> deprecation date, from the table's rows (``| python3.13 | ... | 2029-06-30 | ...``)."""
    dates = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("python"):
            dates[cells[0]] = dt.date.fromisoformat(cells[2])
    return dates


def runtimes_named(template: dict[str, Any]) -> dict[str, str]:
    """Where each runtime is named -> the runtime: Globals, each function, each layer."""
    found = {}
    runtime = template.get("Globals", {}).get("Function", {}).get("Runtime")
    if runtime:
        found["Globals.Function.Runtime"] = runtime
    for logical, resource in template["Resources"].items():
        props = resource.get("Properties", {})
        if resource["Type"] in ("AWS::Serverless::Function", "AWS::Lambda::Function") and "Runtime" in props:
            found[f"{logical}.Runtime"] = props["Runtime"]
        if resource["Type"] in ("AWS::Serverless::LayerVersion", "AWS::Lambda::LayerVersion"):
            for i, name in enumerate(props.get("CompatibleRuntimes", [])):
                found[f"{logical}.CompatibleRuntimes[{i}]"] = name
    return found


def unsupported(template: dict[str, Any], today: dt.date, dates: dict[str, dt.date]) -> list[str]:
    """One line per runtime that is unknown, deprecated, or within the margin of deprecation."""
    problems = []
    for where, runtime in runtimes_named(template).items():
        if runtime not in dates:
            problems.append(f"{where}: {runtime} is not in {TABLE.name}; add its dates from AWS's runtimes table")
        elif dates[runtime] <= today:
            problems.append(f"{where}: {runtime} was deprecated on {dates[runtime]}")
        elif (dates[runtime] - today).days < MARGIN_DAYS:
            problems.append(f"{where}: {runtime} is deprecated on {dates[runtime]}, "
                            f"{(dates[runtime] - today).days} days from now (less than {MARGIN_DAYS})")
    return problems


def test_every_runtime_in_the_template_is_supported_for_a_year_more() -> None:
    template = load_template()
    assert runtimes_named(template), "template.yaml names no runtime"
    assert unsupported(template, dt.date.today(), deprecation_dates()) == []


def test_the_table_lists_what_aws_does() -> None:
    dates = deprecation_dates()
    # Two rows pin the table's reading: the runtime we deploy and the one we left.
    assert dates["python3.13"] == dt.date(2029, 6, 30)
    assert dates["python3.11"] == dt.date(2026, 6, 30)


@pytest.mark.parametrize(("runtime", "today", "why"), [
    ("python3.11", dt.date(2026, 12, 1), "python3.11 was deprecated on 2026-06-30"),
    ("python3.12", dt.date(2028, 1, 1), "python3.12 is deprecated on 2028-10-31, 304 days from now"),
    ("python3.14", dt.date(2026, 12, 1), "python3.14 is not in lambda-python-runtimes.md"),
])
def test_a_runtime_near_or_past_deprecation_is_refused(runtime: str, today: dt.date, why: str) -> None:
    template = load_template()
    template["Globals"]["Function"]["Runtime"] = runtime
    problems = unsupported(template, today, deprecation_dates())
    assert len(problems) == 1 and problems[0].startswith("Globals.Function.Runtime: ")
    assert why in problems[0]


def test_the_layer_is_checked_too() -> None:
    template = load_template()
    template["Resources"]["RuntimeLayer"]["Properties"]["CompatibleRuntimes"] = ["python3.13", "python3.11"]
    assert unsupported(template, dt.date(2026, 12, 1), deprecation_dates()) == [
        "RuntimeLayer.CompatibleRuntimes[1]: python3.11 was deprecated on 2026-06-30"]
