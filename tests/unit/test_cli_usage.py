"""The ``serverless-worker`` command's usage checks, in process: what a newcomer mistypes.

A misspelt choice is one line with a suggestion, not a screenful of usage; ``--queue X
--handlers X`` is the same request said twice, and only different names are refused.
"""

from __future__ import annotations

import os

import pytest

from serverless_worker.cli import build_parser
from serverless_worker.cli._resolve import build_settings
from serverless_worker.errors import ConfigurationError


@pytest.fixture(autouse=True)
def no_sw_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.upper().startswith("SW_")]:
        monkeypatch.delenv(name)


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_a_misspelt_protocol_is_one_line_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["local", "--protocol", "pipelogic"], capsys)

    assert err == ("serverless-worker: error: --protocol 'pipelogic' is not one of pipelogiq, priostack, "
                   "claimqueue (did you mean 'pipelogiq'?) (serverless-worker local --help)\n")


def test_a_choice_like_none_of_them_gets_no_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["local", "--transport", "carrier-pigeon"], capsys)

    assert err == ("serverless-worker: error: --transport 'carrier-pigeon' is not one of http, socket "
                   "(serverless-worker local --help)\n")


def test_other_usage_errors_are_one_line_too(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["local", "--batch-size"], capsys)

    assert err.count("\n") == 1 and "usage:" not in err
    assert err.startswith("serverless-worker: error: argument --batch-size: expected one argument")


def test_a_valid_choice_still_parses() -> None:
    args = build_parser().parse_args(["local", "--protocol", "claimqueue"])

    settings = build_settings(args).settings

    assert settings.protocol == "claimqueue"


@pytest.mark.parametrize("handlers", [["resize"], ["resize,resize"]])
def test_queue_and_handlers_naming_the_same_handler_are_accepted(handlers: list[str]) -> None:
    args = build_parser().parse_args(["local", "--protocol", "claimqueue", "--queue", "resize",
                                      "--criteria", '{"format": "jpg"}', "--handlers", *handlers])

    settings = build_settings(args).settings

    assert settings.handlers == ["resize"]
    assert settings.criteria == {"resize": {"format": "jpg"}}


def test_queue_and_handlers_naming_different_handlers_are_refused_in_one_line() -> None:
    args = build_parser().parse_args(["local", "--protocol", "claimqueue", "--queue", "resize",
                                      "--handlers", "thumbnail"])

    with pytest.raises(ConfigurationError) as caught:
        build_settings(args)

    lines = [line for line in str(caught.value).splitlines() if "--queue" in line]
    assert lines == ["  --queue resize, --handlers thumbnail: they name different handlers; give one of them "
                     "(a claim queue's name is its handler's)"]
