"""A misspelt ``SW_*`` variable is reported once, naming the closest setting.

Without the warning, ``SW_BATCHSIZE=50`` leaves the batch size at its default and nobody
notices. Variables the project itself reads that are not settings (test-tier switches)
must stay quiet, so they are on an explicit allow-list that this file keeps honest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverless_worker import settings as settings_module
from serverless_worker.settings import NOT_SETTINGS, Settings, environment_values

ROOT = Path(__file__).resolve().parents[2]
SECRET = "value-that-must-not-be-logged-91c2"
# Where the project reads an SW_ variable from the environment itself (not through Settings).
_READS = re.compile(r"""(?:environ(?:\.get)?\(|environ\[|getenv\(|setenv\()\s*["'](SW_[A-Z0-9_]+)["']""")
_MAKE_ASSIGNMENT = re.compile(r"\b(SW_[A-Z0-9_]+)=")


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts as a fresh process would: nothing reported yet."""
    monkeypatch.setattr(settings_module, "_reported_unknown", set())
    yield


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "serverless_worker.settings" and r.levelname == "WARNING"]


def test_a_misspelt_variable_warns_naming_the_closest_setting(caplog: pytest.LogCaptureFixture) -> None:
    values = environment_values({"SW_BATCHSIZE": "50", "SW_MAX_INFLIGHT": SECRET})

    assert values == {}
    assert warnings_in(caplog) == [
        "SW_BATCHSIZE is not a setting and is ignored (did you mean SW_BATCH_SIZE?)",
        "SW_MAX_INFLIGHT is not a setting and is ignored (did you mean SW_MAX_IN_FLIGHT?)",
    ]
    assert SECRET not in caplog.text


def test_each_name_warns_once_however_often_settings_are_read(caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(3):
        environment_values({"sw_protocl": "priostack", "SW_BASE_URL": "https://jobs.example.com"})

    assert warnings_in(caplog) == ["sw_protocl is not a setting and is ignored (did you mean SW_PROTOCOL?)"]


def test_a_name_like_no_setting_points_at_the_config_command(caplog: pytest.LogCaptureFixture) -> None:
    environment_values({"SW_ZZZ": "1"})

    assert warnings_in(caplog) == ["SW_ZZZ is not a setting and is ignored "
                                   "(`serverless-worker config` lists the settings)"]


def test_settings_empty_variables_and_the_allow_list_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"SW_BATCH_SIZE": "5", "SW_BATCHSIZE": "", **dict.fromkeys(NOT_SETTINGS, "1")}

    assert environment_values(environ) == {"batch_size": "5"}
    assert warnings_in(caplog) == []


def test_every_sw_variable_the_project_reads_is_a_setting_or_allow_listed() -> None:
    settings = {f"SW_{name.upper()}" for name in Settings.model_fields}
    read: set[str] = set()
    for base in ("layers", "functions", "scripts", "tests", "benchmarks"):
        for path in (ROOT / base).rglob("*.py"):
            read |= set(_READS.findall(path.read_text()))
    read |= set(_MAKE_ASSIGNMENT.findall((ROOT / "Makefile").read_text()))
    test_fixtures = {"SW_NOT_A_SETTING"}   # set on purpose by the test that checks they are ignored

    assert {"SW_DEPLOYED_TIER", "SW_FAULT_SEED"} <= read   # the scan finds them at all
    assert read - settings - test_fixtures <= NOT_SETTINGS
