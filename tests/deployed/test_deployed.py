"""The real stack in LocalStack: short jobs of every protocol on the stack's own schedule,
the long-running path on LocalStack's Step Functions interpreter, the failure paths as
deployed (dead-letter queue, drain, a redeploy while jobs run, `sam delete`), and no
secret in any function's logs. Beside them, the project `serverless-worker init` writes,
deployed as its README says: its jobs on its schedule, its alarms, its logs, `sam delete`.
The tests run in file order against the session's stacks (conftest.py); outcomes are read
on both sides, the sandbox's own history and the ledger in LocalStack's table, with the AWS
tier's helpers.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from aws.e2e_support import in_flight, jobs_by_id, ledger, results
from aws.e2e_support import wait_for as poll
from aws.test_short_path import (
    _check_claimqueue_outcomes,
    _check_pipelogiq_outcomes,
    _check_priostack_outcomes,
    _handler_of,
    _only_result,
    _terminal,
)
from deployed.conftest import PROTOCOLS, Tier
from deployed.init_project import INIT_PROTOCOL, InitStack
from deployed.localstack import DeployedStack, clients, log_lines
from reliability.invariants import FINAL_STATES, check, observe
from serverless_worker.model import LedgerStatus, OutcomeKind

# The schedule fires once a minute; a tick pulls for 20 s; LocalStack starts a container per
# function on first use (seconds on two busy cores).
SCHEDULE_WAIT = 300.0
_CHECKS = {"pipelogiq": _check_pipelogiq_outcomes, "priostack": _check_priostack_outcomes,
           "claimqueue": _check_claimqueue_outcomes}


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 1.0) -> Any:
    """The AWS tier's wait, polling once a second: deployed functions answer in seconds."""
    return poll(predicate, timeout, what, interval)


def ticks(stack: DeployedStack) -> Counter[str]:
    """The scheduler's "tick started" lines by trigger (schedule / direct), from its logs."""
    seen: Counter[str] = Counter()
    for line in log_lines(stack.logs, f"/aws/lambda/{stack.outputs['SchedulerFunctionName']}"):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("message") == "tick started":
            seen[str(record.get("trigger"))] += 1
    return seen


# -- 0. an executor event that fails every attempt (sent first: LocalStack retries it later) ----
def test_dead_letter_event_sent(tier: Tier) -> None:
    stack = tier.stacks["priostack"]
    function = stack.outputs["ExecutorFunctionName"]
    config = stack.lambda_client.get_function_event_invoke_config(FunctionName=function, Qualifier="live")
    assert config["MaximumRetryAttempts"] == 2, config
    assert config["DestinationConfig"]["OnFailure"]["Destination"].endswith(":" + stack.outputs[
        "DeadLetterQueueUrl"].rsplit("/", 1)[1]), config
    # LocalStack 2026.3.0 looks an invocation's event invoke config up by the version's number
    # only, so the alias's (where SAM puts it, and AWS applies it) is never used there: the
    # same config goes on the version the alias points to, for LocalStack's sake only.
    version = stack.lambda_client.get_alias(FunctionName=function, Name="live")["FunctionVersion"]
    stack.lambda_client.put_function_event_invoke_config(
        FunctionName=function, Qualifier=version, MaximumRetryAttempts=config["MaximumRetryAttempts"],
        MaximumEventAgeInSeconds=config["MaximumEventAgeInSeconds"], DestinationConfig=config["DestinationConfig"])
    stack.invoke("ExecutorFunction", {"probe": "dead-letter"}, asynchronous=True)  # no ledger_key: fails
    tier.dlq_sent_at = time.monotonic()


# -- 1. the short path of every protocol, driven by the schedule ---------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_short_path_on_the_schedule(tier: Tier, protocol: str) -> None:
    """The jobs were seeded before the deploy, and nothing here invokes the scheduler: every
    tick that works them comes from the stack's EventBridge schedule."""
    env, stack = tier.envs[protocol], tier.stacks[protocol]
    wait_for(lambda: all(_terminal(protocol, j) for j in env.admin.jobs()), SCHEDULE_WAIT,
             f"[{protocol}] every seeded job settled by scheduled ticks")
    seen = wait_for(lambda: ticks(stack) or None, 30, f"[{protocol}] the scheduler's tick log lines")
    assert seen["schedule"] >= 1 and seen["direct"] == 0, seen
    tier.schedule_ticks[protocol] = seen["schedule"]

    jobs = jobs_by_id(env)
    by_handler: dict[str, list[dict[str, Any]]] = {}
    for job in jobs.values():
        by_handler.setdefault(_handler_of(protocol, job), []).append(job)
    good, bad = sorted(by_handler["e2e.validated"], key=lambda j: "amount\": -1" in json.dumps(j))
    (ghost,), (rejected,), (failed,) = by_handler["e2e.ghost"], by_handler["e2e.reject"], by_handler["e2e.boom"]
    _CHECKS[protocol](good, bad, ghost, rejected, failed)  # the protocol mapping, job by job

    # The ledger: one item per delivery (a retry is its own), every one acknowledged, once.
    expected = 5 if protocol == "claimqueue" else 6
    wait_for(lambda: [i for i in ledger(env) if i.status is LedgerStatus.ACKNOWLEDGED][expected - 1:], 30,
             f"[{protocol}] {expected} acknowledged ledger items")
    items = ledger(env)
    assert len(items) == expected and all(i.status is LedgerStatus.ACKNOWLEDGED for i in items), items
    assert len({i.key for i in items}) == expected
    observed = observe(env, {})
    check(observed, final_states=set(FINAL_STATES[protocol]))
    assert in_flight(env) == 0
    tier.jobs[protocol] = Counter(observed.states.values())


# -- 2. the long-running path on LocalStack's Step Functions interpreter --------------------------
def _pipelogiq_job(env: Any, handler: str) -> dict[str, Any]:
    (job,) = [j for j in env.admin.jobs() if j["handler"] == handler]
    return job


def test_long_running_path(tier: Tier) -> None:
    env, stack = tier.envs["pipelogiq"], tier.stacks["pipelogiq"]
    before = {e["executionArn"] for e in stack.executions()}
    env.seed("long-steady", [{"seconds": 35, "tag": "steady"}])        # 35 s under a 25 s lease
    env.seed("long-pages", [{"pages": 3, "tag": "pg"}])                # three slices
    env.seed("long-callback-patient", [{}])                            # the test answers it
    env.seed("long-callback", [{"mode": "never"}], maxRetries=0)       # nobody answers: 4 s timeout
    stack.tick(10)  # a direct tick, so this does not wait for the next minute

    def patient_token() -> str | None:
        items = [i for i in ledger(env) if i.handler == "long-callback-patient" and i.callback_token]
        return items[0].callback_token if items else None

    token = wait_for(patient_token, 120, "the patient callback's task token in the ledger")
    stack.sfn.send_task_success(taskToken=token, output=json.dumps({"external": "done", "by": "test"}))

    def finished() -> list[dict[str, Any]] | None:
        runs = [e for e in stack.executions() if e["executionArn"] not in before]
        done = [e for e in runs if e["status"] != "RUNNING"]
        return runs if len(runs) >= 4 and len(done) == len(runs) else None

    runs = wait_for(finished, 240, "four long-running executions finished", interval=2)
    assert {e["status"] for e in runs} == {"SUCCEEDED"}, runs

    steady = _pipelogiq_job(env, "long-steady")
    assert steady["status"] == "Completed", steady
    renewals = [h for h in steady["history"] if h["event"] == "lease_renewed"]
    assert len(renewals) >= 2, renewals  # it outlived its 25 s lease only by renewing it
    assert json.loads(steady["output"]) == {"slept": 35.0, "tag": "steady"}
    pages = _pipelogiq_job(env, "long-pages")
    assert pages["status"] == "Completed" and json.loads(pages["output"]) == {
        "pages": 3, "parts": ["pg-1", "pg-2", "pg-3"]}, pages
    patient = _pipelogiq_job(env, "long-callback-patient")
    assert patient["status"] == "Completed" and json.loads(patient["output"]) == {
        "external": "done", "by": "test"}, patient
    never = _pipelogiq_job(env, "long-callback")
    received = [h for h in never["history"] if h["event"] == "result_received"]
    assert [(r["isSuccess"], r["errorCode"], r["retryable"]) for r in received] == [
        (False, "HANDLER_TIMEOUT", True)], received
    assert never["status"] == "Failed", never  # maxRetries 0: the server does not retry it

    by_handler = {i.handler: i for i in ledger(env) if i.handler.startswith("long-")}
    assert {h: i.status for h, i in by_handler.items()} == dict.fromkeys(
        ("long-steady", "long-pages", "long-callback-patient", "long-callback"), LedgerStatus.ACKNOWLEDGED)
    assert by_handler["long-steady"].renewals >= 2
    assert by_handler["long-callback"].outcome is not None
    assert by_handler["long-callback"].outcome.kind is OutcomeKind.TIMEOUT
    timed_out = [e for e in runs if "CallbackFailed" in json.dumps(
        stack.sfn.get_execution_history(executionArn=e["executionArn"], maxResults=1000)["events"], default=str)]
    assert len(timed_out) == 1, timed_out
    assert in_flight(env) == 0
    finals = (steady["status"], pages["status"], patient["status"], never["status"])
    tier.jobs.setdefault("pipelogiq", Counter()).update(s.lower() for s in finals)


# -- 2b. the project `serverless-worker init` writes, deployed beside the main stacks -------------
# Checked after the long-running path: by then its first tick has ended and its log lines are in.
def _init(tier: Tier) -> InitStack:
    assert tier.init is not None and tier.init.env is not None, "the init stack was not deployed"
    return tier.init


def test_init_stack_works_its_jobs_on_the_schedule(tier: Tier) -> None:
    """Its example handler's two jobs, seeded before the deploy, worked by scheduled ticks only:
    the greeting completes with its result, the rejection is reported as such, never retried."""
    init = _init(tier)
    env, stack = init.env, init.stack
    wait_for(lambda: all(_terminal(INIT_PROTOCOL, j) for j in env.admin.jobs()), SCHEDULE_WAIT,
             "[init] both greet jobs settled by scheduled ticks")
    # LocalStack writes a function's log lines when its invocation ends, and a tick pulls for
    # its whole poll window (50 s by default): usually over by now, else waited for.
    seen = wait_for(lambda: ticks(stack) or None, 120, "[init] the scheduler's tick log lines")
    assert seen["schedule"] >= 1 and seen["direct"] == 0, seen
    init.schedule_ticks = seen["schedule"]

    jobs = {json.loads(j["input"])["name"]: j for j in env.admin.jobs()}
    assert sorted(jobs) == ["Ada", "nobody"], jobs
    ada, nobody = jobs["Ada"], jobs["nobody"]
    assert ada["status"] == "Completed" and json.loads(ada["output"]) == {"greeting": "Hello, Ada!"}, ada
    assert len(results(INIT_PROTOCOL, ada)) == 1, ada
    rejection = _only_result(INIT_PROTOCOL, nobody)
    assert (rejection["isSuccess"], rejection["retryable"], rejection["errorCode"]) == (
        False, False, "BUSINESS_REJECTED"), rejection
    assert json.loads(rejection["result"]) == {"code": "NO_ONE_TO_GREET", "message": "there is nobody to greet",
                                               "variables": {"greeted": False}}, rejection
    assert nobody["status"] == "Failed" and nobody["failures"] == 1, nobody

    wait_for(lambda: [i for i in ledger(env) if i.status is LedgerStatus.ACKNOWLEDGED][1:], 30,
             "[init] two acknowledged ledger items")
    items = ledger(env)
    assert len(items) == 2 and all(i.status is LedgerStatus.ACKNOWLEDGED for i in items), items
    observed = observe(env, {})
    check(observed, final_states=set(FINAL_STATES[INIT_PROTOCOL]))
    assert in_flight(env) == 0
    init.jobs = dict(Counter(observed.states.values()))

    # Every alarm notifies the topic given as AlarmTopicArn, when it fires and when it clears.
    alarms = clients("cloudwatch").describe_alarms(AlarmNamePrefix=stack.name)["MetricAlarms"]
    assert len(alarms) == 7, [a["AlarmName"] for a in alarms]
    assert all(a["AlarmActions"] == [init.topic_arn] == a["OKActions"] for a in alarms), alarms
    init.notes.append(f"{len(alarms)} alarms notify its topic")


def test_init_stack_logs_hold_no_secret(tier: Tier) -> None:
    """Then its `sam delete` starts, and runs while the main stacks' tests do."""
    init = _init(tier)
    stack = init.stack
    secrets = [*tier.secrets, *tier.tokens.issued]
    scanned = 0
    for group in stack.log_groups():
        lines = log_lines(stack.logs, group)
        if "SchedulerFunction" in group or "ExecutorFunction" in group:
            assert lines, f"{group} holds no log lines: nothing was scanned"
        text = "\n".join(lines)
        scanned += len(lines)
        leaked = [s[:12] + "..." for s in secrets if s in text]
        assert not leaked and "SWSECRET" not in text, f"{group} leaks {leaked or 'the marker'}"

    init.notes.append(f"{scanned} log lines scanned, no key or token")
    pool = ThreadPoolExecutor(1)
    init.delete = pool.submit(tier.sam.delete, stack.name)  # test_init_stack_sam_delete_removed_it waits
    pool.shutdown(wait=False)


# -- 3. a drain leaves nothing in flight ------------------------------------------------------------
def test_drain_leaves_nothing_in_flight(tier: Tier) -> None:
    """Pipelogiq: a handed-back delivery (ack with requeue) is delivered again at once, where a
    claim-queue item would wait out its lease."""
    env, stack = tier.envs["pipelogiq"], tier.stacks["pipelogiq"]

    def slow() -> list[dict[str, Any]]:
        return [j for j in env.admin.jobs() if j["handler"] == "e2e.slow"]

    # Held running until the drain has begun (the drain's flag in the state table), so the
    # drain finds both in flight however late a loaded machine brings the DrainFunction.
    env.seed("e2e.slow", [{"sleep": 1, "until_draining": True, "n": i} for i in range(2)])
    stack.tick(8)
    wait_for(lambda: sum(i.status is LedgerStatus.RUNNING for i in ledger(env) if i.handler == "e2e.slow") == 2,
             150, "two slow jobs running in executors")

    report = stack.invoke("DrainFunction", {"grace_seconds": 60})

    assert report["still_running"] == 0 and report["shutdown_called"] is True, report
    assert report["finished_in_flight"] + report["handed_back"] == 2, report
    assert in_flight(env) == 0
    assert stack.invoke("DrainFunction", {"resume": True}) == {"resumed": True}
    if report["handed_back"]:  # delivered again after the resume
        stack.tick(8)
    wait_for(lambda: all(j["status"] == "Completed" for j in slow()), 150, "the slow jobs completed")
    jobs = slow()
    assert len(jobs) == 2 and all(len(results("pipelogiq", j)) == 1 for j in jobs), jobs
    check(observe(env, {}), final_states=set(FINAL_STATES["pipelogiq"]))
    tier.jobs.setdefault("pipelogiq", Counter()).update(j["status"].lower() for j in jobs)
    tier.notes.append(f"drain: {report['finished_in_flight']} finished in flight, {report['handed_back']} handed back")


# -- 4. a second deploy with a changed parameter while jobs run loses none of them ----------------
def test_redeploy_while_jobs_are_in_flight(tier: Tier) -> None:
    env, stack = tier.envs["priostack"], tier.stacks["priostack"]
    alias = stack.lambda_client.get_alias(FunctionName=stack.outputs["ExecutorFunctionName"], Name="live")
    env.seed("e2e.slow", [{"sleep": 20, "n": i} for i in range(3)])
    stack.tick(10)
    wait_for(lambda: sum(i.status is LedgerStatus.RUNNING for i in ledger(env)) >= 1, 150,
             "a slow job running in an executor")
    assert in_flight(env) >= 1

    # A parameter-only deploy without a new ConfigRevision, so `live` stays where it is: LocalStack
    # cannot move an alias to a new version through CloudFormation (it creates the alias again
    # and fails with "Alias already exists"; AWS updates it in place). That a new ConfigRevision
    # publishes a version is checked on SAM's own transform (scripts/check_versions.py).
    took = tier.sam.deploy(stack.name, {**stack.parameters, "LogLevel": "DEBUG"})
    tier.notes.append(f"redeploy {took:.0f} s")

    latest = stack.lambda_client.get_function_configuration(FunctionName=stack.outputs["ExecutorFunctionName"])
    assert latest["Environment"]["Variables"]["SW_LOG_LEVEL"] == "DEBUG", latest["Environment"]
    after = stack.lambda_client.get_alias(FunctionName=stack.outputs["ExecutorFunctionName"], Name="live")
    # (LocalStack answers GetFunctionConfiguration for a version, not for an alias.)
    live = stack.lambda_client.get_function_configuration(FunctionName=stack.outputs["ExecutorFunctionName"],
                                                          Qualifier=after["FunctionVersion"])
    tier.notes.append(f"live alias v{alias['FunctionVersion']} -> v{after['FunctionVersion']} "
                      f"(LogLevel there {live['Environment']['Variables']['SW_LOG_LEVEL']})")
    assert after["FunctionVersion"] == alias["FunctionVersion"], "no new ConfigRevision: live stays put"

    def slow_jobs() -> list[dict[str, Any]]:
        return [j for j in env.admin.jobs() if j["type"] == "e2e.slow"]

    def all_done() -> bool:
        jobs = slow_jobs()
        if all(j["state"] == "completed" for j in jobs):
            return True
        if in_flight(env) == 0:  # anything handed back is picked up by a tick
            stack.tick(10)
            time.sleep(5)
        return False

    wait_for(all_done, 240, "every slow job completed after the redeploy", interval=3)
    jobs = slow_jobs()
    assert len(jobs) == 3 and [len([c for c in j["calls"] if c.get("applied")]) for j in jobs] == [1, 1, 1], jobs
    check(observe(env, {}), final_states=set(FINAL_STATES["priostack"]))
    tier.jobs.setdefault("priostack", Counter()).update(j["state"] for j in jobs)


# -- 5. the dead-letter queue -----------------------------------------------------------------------
def test_failed_executor_event_lands_in_the_dead_letter_queue(tier: Tier) -> None:
    stack = tier.stacks["priostack"]
    queue = stack.outputs["DeadLetterQueueUrl"]

    def message() -> dict[str, Any] | None:
        got = stack.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=5)
        for raw in got.get("Messages", []):
            body = json.loads(raw["Body"])
            if body.get("requestPayload") == {"probe": "dead-letter"}:
                return body  # type: ignore[no-any-return]
        return None

    body = wait_for(message, max(30.0, 420 - (time.monotonic() - tier.dlq_sent_at)),
                    "the failed executor event in the dead-letter queue", interval=0)
    context = body["requestContext"]
    assert context["condition"] == "RetriesExhausted" and context["approximateInvokeCount"] == 3, body
    assert body["responsePayload"]["errorType"] == "ConfigurationError", body
    tier.notes.append("dead-letter after 3 attempts")


# -- 6. no secret in any function's logs --------------------------------------------------------------
def test_logs_hold_no_secret(tier: Tier) -> None:
    secrets = [*tier.secrets, *tier.tokens.issued]
    assert len([t for t in tier.tokens.issued if "-delivery-" in t]) >= 8, tier.tokens.issued
    scanned = 0
    for stack in tier.stacks.values():
        for group in stack.log_groups():
            lines = log_lines(stack.logs, group)
            if "SchedulerFunction" in group or "ExecutorFunction" in group:
                assert lines, f"{group} holds no log lines: nothing was scanned"
            text = "\n".join(lines)
            scanned += len(lines)
            leaked = [s[:12] + "..." for s in secrets if s in text]
            assert not leaked and "SWSECRET" not in text, f"{group} leaks {leaked or 'the marker'}"
    tier.notes.append(f"{scanned} log lines scanned, no key or token")


# -- 7. sam delete -------------------------------------------------------------------------------------
def test_sam_delete_removes_the_stacks(tier: Tier) -> None:
    cloudformation = clients("cloudformation")
    for stack in tier.stacks.values():
        if tier.calls is not None:
            try:  # for `make iam-proof`, before the delete can take the log groups
                tier.calls.collect(stack)
            except Exception as err:  # the proof then fails on the missing calls; the delete is tested here
                tier.notes.append(f"AWS calls of {stack.name} not collected: {type(err).__name__}: {err}")
        tier.sam.delete(stack.name)
        try:
            status = cloudformation.describe_stacks(StackName=stack.name)["Stacks"][0]["StackStatus"]
        except cloudformation.exceptions.ClientError as err:
            assert "does not exist" in str(err), err
        else:
            assert status == "DELETE_COMPLETE", status
        for logical in ("SchedulerFunction", "ExecutorFunction", "StepsFunction", "DrainFunction"):
            with pytest.raises(stack.lambda_client.exceptions.ResourceNotFoundException):
                stack.lambda_client.get_function(FunctionName=stack.outputs[f"{logical}Name"])
        rules = clients("events").list_rules(NamePrefix=stack.name)["Rules"]
        assert rules == [], rules  # no schedule left firing


# -- 8. the init stack's sam delete (started after its log scan) removed it --------------------------
def test_init_stack_sam_delete_removed_it(tier: Tier) -> None:
    init = _init(tier)
    stack = init.stack
    assert init.delete is not None, "the init stack's sam delete never started"
    took = init.delete.result(timeout=600)
    cloudformation = clients("cloudformation")
    try:
        status = cloudformation.describe_stacks(StackName=stack.name)["Stacks"][0]["StackStatus"]
    except cloudformation.exceptions.ClientError as err:
        assert "does not exist" in str(err), err
    else:
        assert status == "DELETE_COMPLETE", status
    for logical in stack.functions:
        with pytest.raises(stack.lambda_client.exceptions.ResourceNotFoundException):
            stack.lambda_client.get_function(FunctionName=stack.outputs[f"{logical}Name"])
    assert clients("events").list_rules(NamePrefix=stack.name)["Rules"] == []  # no schedule left firing
    # The README's tear-down: the table outlives the stack (Retain); then it, and the secret, go.
    stack.dynamodb.delete_table(TableName=stack.table_name)
    clients("secretsmanager").delete_secret(SecretId=stack.parameters["ApiKeySecretArn"],
                                            ForceDeleteWithoutRecovery=True)
    init.notes.append(f"sam delete {took:.0f} s (beside the main stacks' tests)")
