"""The runtime's settings in one validated model, read from ``SW_*`` environment variables.

These are what the Lambda functions read; the local command adds its own (the state file,
when to stop, ...) in ``local/settings.py``, a subclass of this model, and the test tiers'
switches are named outside the ``SW_`` prefix (``SWTEST_*``), so nothing here is theirs.

A bad configuration fails once, with one :class:`ConfigurationError` listing every bad
setting by its environment variable name (``SW_BATCH_SIZE: ...``), never echoing a
value (an API key or a URL with credentials could be one). Importing this module is
cheap: boto3 and Powertools are imported only where credentials are read
(``credentials.py``), and the variables are read by :func:`environment_values` with plain
pydantic rather than pydantic-settings, whose import alone cost a Lambda cold start about
as much as all the other settings code together.

Example::

    settings = load_settings(protocol="priostack", base_url="https://priostack.example.com")
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Collection, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from .errors import ConfigurationError
from .loopback import is_loopback_host
from .registry import HANDLER_NAME_RE

__all__ = [
    "ENV_PREFIX",
    "Protocol",
    "Settings",
    "environment_values",
    "format_settings_error",
    "load_settings",
]

ENV_PREFIX = "SW_"
Protocol = Literal["pipelogiq", "priostack", "claimqueue"]

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


# The fields a subclass adds (the local command's ``LocalSettings``, local/settings.py): settings
# of another command, which this model ignores without calling them misspelt.
_other_commands_fields: set[str] = set()
_reported_unknown: set[str] = set()


def environment_values(environ: Mapping[str, str] | None = None, *,
                       fields: Collection[str] | None = None) -> dict[str, str]:
    """The ``SW_<NAME>`` variables that name a setting, by field name, as the text they hold.

    ``fields``: the model's fields (default the runtime's, :class:`Settings`). Names match
    case-insensitively; empty variables count as unset. Any other non-empty ``SW_``
    variable is ignored, with one warning per name naming the closest setting, since a
    misspelt variable otherwise leaves its setting at the default without a word; a setting
    of another command (the local command's) is ignored quietly.
    Values stay text: the model's validators parse them, and a structured setting parses
    its own text in a ``before`` validator (``handlers``, ``criteria``).
    """
    known = Settings.model_fields.keys() if fields is None else fields
    prefix = ENV_PREFIX.lower()
    found: dict[str, str] = {}
    for name, value in (os.environ if environ is None else environ).items():
        key = name.lower()
        if not value or not key.startswith(prefix):
            continue
        if key[len(prefix):] in known:
            found[key[len(prefix):]] = value
        elif key[len(prefix):] not in _other_commands_fields:
            _report_unknown(name, known)
    return found


def _report_unknown(name: str, fields: Collection[str]) -> None:
    """Warn, once per process, that ``name`` is not a setting; never its value (it could be a key)."""
    upper = name.upper()
    if upper in _reported_unknown:
        return
    _reported_unknown.add(upper)
    known = [_env_name(field) for field in fields]
    close = difflib.get_close_matches(upper, known, n=1)
    hint = f"did you mean {close[0]}?" if close else "`serverless-worker config` lists the settings"
    logging.getLogger("serverless_worker.settings").warning(
        "%s is not a setting and is ignored (%s)", name, hint)


class Settings(BaseModel):
    """The worker's settings; each field is ``SW_<NAME>`` in the environment.

    ``handlers`` reads as ``a,b`` or a JSON list; ``criteria`` as a JSON object mapping
    a handler name to its claim-queue criteria. Empty variables count as unset. Keyword
    arguments win over the environment.
    """

    model_config = ConfigDict(extra="forbid", validate_default=True)

    protocol: Protocol = Field(
        "pipelogiq", description="Worker protocol of the job server: pipelogiq, priostack or claimqueue.")
    base_url: str = Field(
        description="Job server base URL: https://, or http:// to loopback (or with allow_insecure_http).")
    # Credentials: SW_API_KEY locally; in AWS a Secrets Manager secret or an SSM SecureString.
    api_key: SecretStr | None = Field(
        None, description="The API key or bearer token itself: local use only, never a CLI flag "
                          "(the local command reads it from the variable named by --api-key-env).")
    api_key_secret_arn: str | None = Field(
        None, description="Secrets Manager secret holding the API key (the bare key or JSON with api_key).")
    api_key_parameter: str | None = Field(
        None, description="SSM SecureString parameter holding the API key (instead of a secret).")
    handlers: list[str] = Field(
        default_factory=list, description="Handler names to pull for (a,b or a JSON list); empty means "
                                          "every registered handler.")
    handler_module: str = Field(
        "functions.handlers", description="Module, package directory or .py file that registers the "
                                          "@handler functions.")
    criteria: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description='Claim-queue criteria per handler as JSON, '
                                          '{"resize": {"format": "jpg"}}; overrides @handler(criteria=...).')
    instance_id: str = Field("serverless-worker", min_length=1, max_length=128,
                             pattern=r"^[A-Za-z0-9._:\-]+$",
                             description="Worker instance id: names the session, the ledger scope and "
                                         "the worker on the job server.")
    batch_size: int = Field(10, ge=1, le=1000, description="Most deliveries taken per pull call.")
    max_in_flight: int = Field(50, ge=1, description="Most deliveries in flight at once across executors.")
    poll_window_seconds: float = Field(50, ge=0, le=840,
                                       description="How long one scheduler tick keeps pulling and "
                                                   "heartbeating; below the schedule period.")
    schedule_seconds: int = Field(60, ge=1, description="Period of the scheduler schedule, in seconds.")
    liveness: Literal["full-window", "continuous", "while-work"] = Field(
        "full-window", description="What a tick without work does: full-window pulls and heartbeats for the "
                                   "whole poll window; continuous stays only as long as heartbeats must to "
                                   "keep the worker online between ticks (Pipelogiq; one round of pulls "
                                   "elsewhere); while-work makes one round of pulls. Every mode keeps "
                                   "pulling while pulls return work. The stack defaults to continuous.")
    poll_backoff_seconds: float = Field(
        0.2, gt=0, description="Wait after the first empty pull without a long poll (Priostack, claim "
                               "queue, or a Pipelogiq server that answers an empty pull at once); "
                               "doubled, with jitter, per empty pull in a row.")
    poll_backoff_max_seconds: float | None = Field(
        None, gt=0, description="Longest wait between empty pulls; unset uses the protocol document's "
                                "(Priostack 5 s, claim queue 2 s, Pipelogiq without a held long poll 5 s).")
    lease_renew_seconds: float = Field(30, gt=0, description="Lease renewal interval while a job runs; "
                                                            "also the long-running path's renew loop.")
    wait_seconds_long_poll: float = Field(20, ge=0, le=20,   # Pipelogiq accepts 0-20
                                          description="Long-poll wait of one pull (Pipelogiq, 0-20 seconds).")
    session_ttl_seconds: float = Field(86400, gt=0, description="Assumed worker session lifetime when "
                                                                "the server does not say (Pipelogiq).")
    session_refresh_margin_seconds: float = Field(3600, ge=0, description="Re-bootstrap the session this "
                                                                          "long before it expires.")
    dispatch_timeout_seconds: float = Field(  # a recorded delivery not started by then is stranded
        420, gt=0, description="A recorded delivery no executor started by then is reaped (handed back).")
    executor_function_name: str | None = Field(None, description="Executor Lambda the scheduler invokes "
                                                                 "(set by the stack).")
    state_machine_arn: str | None = Field(None, description="Long-running state machine (set by the stack).")
    table_name: str | None = Field(None, description="State table (set by the stack; the local command "
                                                     "makes its own).")
    executor_reserved_concurrency: int | None = Field(
        None, ge=1, description="Most executors running at once; the scheduler never pulls more. "
                                "Locally: the executor thread pool's size.")
    self_pull: bool = Field(
        False, description="Executors keep pulling: one that finished a short job pulls the next for the same "
                           "handler itself while pulls come back full and time and capacity allow, and a full "
                           "pull makes the scheduler start more executors (docs/limits.md).")
    self_pull_max_jobs: int = Field(100, ge=1, le=10000,
                                    description="Most deliveries one executor invocation runs when it keeps pulling.")
    self_pull_check_seconds: float = Field(
        5.0, gt=0, description="How often an executor that keeps pulling re-reads the drain flag and the "
                               "in-flight count.")
    max_wait_seconds: float = Field(
        30, gt=0, le=900, description="The longest the worker waits on a job server's word: one call's retries "
                                      "with their back-off and Retry-After, or the pause after a rate-limited "
                                      "pull; a Retry-After beyond what is left is not waited at all.")
    report_margin_seconds: float = Field(  # kept free to store and report the outcome
        10, ge=0, description="Time kept free after the handler to store and report its outcome.")
    counters_flush_seconds: float = Field(
        30, ge=0, description="Write the worker's counters (processed, failed, ...) at most this often "
                              "per container, not once per job; 0 writes every count at once.")
    allow_insecure_http: bool = Field(False, description="Allow plain http:// to a non-loopback job server, and "
                                                        "a plain-text (http://) proxy on a non-loopback host.")
    log_level: str = Field("INFO", description="Log level: DEBUG, INFO, WARNING, ERROR or CRITICAL.")
    connect_timeout: float = Field(3.05, gt=0, description="HTTP connect timeout, seconds.")
    read_timeout: float = Field(10, gt=0, description="HTTP read timeout, seconds (a long poll adds its "
                                                      "wait).")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own fields (the local command's) become settings this model ignores quietly."""
        super().__pydantic_init_subclass__(**kwargs)
        _other_commands_fields.update(set(cls.model_fields) - set(Settings.model_fields))

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**{**environment_values(fields=type(self).model_fields.keys()), **values})
        except ValidationError as err:
            # ``from None``: the chained ValidationError would print input values.
            raise ConfigurationError(format_settings_error(err)) from None

    # -- field parsing -----------------------------------------------------------
    @field_validator("protocol", "log_level", mode="before")
    @classmethod
    def _normalize_word(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        level = value.upper()
        level = "WARNING" if level == "WARN" else level
        if level not in _LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(_LOG_LEVELS)}")
        return level

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL with a host, such as https://jobs.example.com")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials; set SW_API_KEY (or a secret) instead")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query string or fragment")
        return value.strip().rstrip("/")

    @field_validator("api_key", mode="before")
    @classmethod
    def _blank_key_is_none(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("api_key_secret_arn", "api_key_parameter", "executor_function_name", "state_machine_arn",
                     "table_name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if not value or any(c.isspace() for c in value):
            raise ValueError("must be a name or ARN without spaces")
        return value

    @field_validator("handlers", mode="before")
    @classmethod
    def _parse_handlers(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    return json.loads(text)
                except ValueError:
                    raise ValueError("is not a valid JSON list; use a,b,c or [\"a\",\"b\"]") from None
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("handlers")
    @classmethod
    def _check_handlers(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not HANDLER_NAME_RE.match(name)]
        if bad:
            raise ValueError(f"invalid handler name(s) {', '.join(map(repr, bad))}: use letters, digits, "
                             "'.', '_', ':' or '-'")
        return list(dict.fromkeys(value))  # drop duplicates, keep order

    @field_validator("criteria", mode="before")
    @classmethod
    def _parse_criteria(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError('is not valid JSON; expected {"handler": {"field": matcher}}') from None
        if isinstance(value, dict) and not all(isinstance(v, dict) for v in value.values()):
            raise ValueError('must map each handler name to a JSON object, {"handler": {"field": matcher}}')
        return value

    # -- cross-field rules ---------------------------------------------------------
    @model_validator(mode="after")
    def _check_together(self) -> Settings:
        problems: list[str] = []
        parts = urlsplit(self.base_url)
        if parts.scheme == "http" and not self.allow_insecure_http and not is_loopback_host(parts.hostname or ""):
            problems.append(f"{_env_name('base_url')}: plain http:// is allowed only to loopback "
                            f"(localhost, 127.0.0.1, ::1); use https:// or set "
                            f"{_env_name('allow_insecure_http')}=true")
        if self.api_key_secret_arn and self.api_key_parameter:
            problems.append(f"{_env_name('api_key_secret_arn')}, {_env_name('api_key_parameter')}: "
                            "set at most one source for the API key")
        if self.handlers:
            unknown = sorted(set(self.criteria) - set(self.handlers))
            if unknown:
                problems.append(f"{_env_name('criteria')}: criteria for handler(s) not in "
                                f"{_env_name('handlers')}: {', '.join(unknown)}")
        if self.session_refresh_margin_seconds >= self.session_ttl_seconds:
            problems.append(f"{_env_name('session_refresh_margin_seconds')}: must be less than "
                            f"{_env_name('session_ttl_seconds')}")
        if problems:
            raise ValueError("\n".join(problems))
        return self


def format_settings_error(err: ValidationError) -> str:
    """``invalid settings:`` then one ``SW_NAME: problem`` line per bad setting, no values."""
    lines: list[str] = []
    for error in err.errors(include_input=False, include_url=False, include_context=False):
        message = str(error["msg"]).removeprefix("Value error, ")
        if not error["loc"]:  # cross-field rules already name their settings
            lines.extend(message.splitlines())
            continue
        name = _env_name(str(error["loc"][0]))
        if error["type"] == "missing":
            message = "required but not set"
        elif error["type"] == "extra_forbidden":
            message = "unknown setting"
        where = ".".join(str(p) for p in error["loc"][1:])
        lines.append(f"{name}{f' [{where}]' if where else ''}: {message}")
    return "invalid settings:\n  " + "\n  ".join(lines)


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment, with ``overrides`` (field names) on top.

    Overrides whose value is ``None`` are ignored, so a CLI can pass optional flags
    straight through. Raises :class:`ConfigurationError` naming each bad setting.
    """
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    logging.getLogger("serverless_worker.settings").debug(
        "settings loaded: protocol=%s handlers=%s", settings.protocol, settings.handlers)
    return settings
