"""A misspelt ``SW_*`` variable is reported once, naming the closest setting.

Without the warning, ``SW_BATCHSIZE=50`` leaves the batch size at its default and nobody
notices. The project's own switches that are not settings (the test tiers') are named
``SWTEST_*``, outside the prefix, so ``settings.py`` knows nothing of them, and this file
checks every ``SW_`` variable the project reads is a setting. The local command's settings
(``local/settings.py``) are quiet in the runtime's model, which ignores them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverless_worker import settings as settings_module
from serverless_worker.local.settings import LocalSettings
from serverless_worker.settings import environment_values

ROOT = Path(__file__).resolve().parents[2]
SECRET = "value-that-must-not-be-logged-91c2"
# Where the project reads an SW_ variable from the environment itself (not through Settings).
_READS = re.compile(r"""(?:environ(?:\.get)?\(|environ\[|getenv\(|setenv\()\s*["']((?:SW|SWTEST)_[A-Z0-9_]+)["']""")
_MAKE_ASSIGNMENT = re.compile(r"\b((?:SW|SWTEST)_[A-Z0-9_]+)=")


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


def test_settings_empty_variables_and_test_tier_switches_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"SW_BATCH_SIZE": "5", "SW_BATCHSIZE": "", "SWTEST_FAULT_SEED": "1", "SWTEST_DEPLOYED_TIER": "1"}

    assert environment_values(environ) == {"batch_size": "5"}
    assert warnings_in(caplog) == []


def test_the_local_commands_settings_are_its_own_and_quiet_in_the_runtimes(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"SW_BATCH_SIZE": "5", "SW_STATE_PATH": "state.sqlite3", "SW_UNTIL_IDLE_SECONDS": "3"}

    assert environment_values(environ) == {"batch_size": "5"}
    assert environment_values(environ, fields=LocalSettings.model_fields.keys()) == {
        "batch_size": "5", "state_path": "state.sqlite3", "until_idle_seconds": "3"}
    assert warnings_in(caplog) == []

    environment_values({"SW_STATE_PTH": "x"}, fields=LocalSettings.model_fields.keys())
    assert warnings_in(caplog) == ["SW_STATE_PTH is not a setting and is ignored (did you mean SW_STATE_PATH?)"]


def test_every_sw_variable_the_project_reads_is_a_setting() -> None:
    settings = {f"SW_{name.upper()}" for name in LocalSettings.model_fields}
    read: set[str] = set()
    for base in ("layers", "functions", "scripts", "tests", "benchmarks"):
        for path in (ROOT / base).rglob("*.py"):
            read |= set(_READS.findall(path.read_text()))
    read |= set(_MAKE_ASSIGNMENT.findall((ROOT / "Makefile").read_text()))
    test_fixtures = {"SW_NOT_A_SETTING"}   # set on purpose by the test that checks they are ignored

    assert {"SWTEST_DEPLOYED_TIER", "SWTEST_FAULT_SEED", "SW_BASE_URL"} <= read   # the scan finds them at all
    assert {name for name in read if name.startswith("SW_")} - settings - test_fixtures == set()
