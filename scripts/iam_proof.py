"""Least privilege proven by running it: every AWS API call each function made in the
deployed tier, evaluated against that function's role as ``sam build`` produced it.

``make test-deployed`` deploys every stack with ``RecordAwsCalls=true``: each function then
logs one line per AWS call (``serverless_worker/awscall_log.py``), and the tier writes them,
with each stack's parameters and physical resources, to ``.aws-sam/deployed/aws-calls.json``
(``tests/deployed/aws_calls.py``). This script

1. expands each stack's built template into CloudFormation (``sam_to_cfn.translate``, SAM's
   own transform, with the stack's parameters) and resolves each function's role, inline
   and managed policies, with the deployed stack's physical names (``Ref``, ``Fn::GetAtt``,
   ``Fn::Sub``, ``Fn::If`` on the template's conditions);
2. turns each recorded call into an IAM request: its action, the resource ARN the
   operation acts on, the condition keys it would carry;
3. evaluates every request with ``@cloud-copilot/iam-simulate`` (``scripts/iam_proof/``,
   pinned by its package-lock.json), AWS's evaluation logic rather than a hand-written
   matcher, and notes which statement allowed each call;
4. prints ``iam: N calls by M functions, D denied, K grants never used``, each denial, each
   grant never used (with the reason it is kept, where one is named in ``KEPT``), and exits
   1 on any denial or a request the evaluator refused.

Run with the SAM CLI's virtualenv (``samtranslator``)::

    .venv-sam/bin/python scripts/iam_proof.py .aws-sam/deployed/aws-calls.json [--table]

``--table`` also prints the grants table docs/operating.md holds.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["KEPT", "main"]

EVALUATOR = Path(__file__).resolve().parent / "iam_proof"

# Functions that bootstrap a Pipelogiq session only when they find none fresh (the scheduler
# keeps it fresh), and what they are.
_BOOTSTRAPPERS = (("ExecutorFunction", "run"), ("StepsFunction", "step"), ("DrainFunction", "drain"))

# Grants no function's code calls, kept for a path named here: (function, action) -> why.
# "*" as the function: every function. A grant never used and not named here is listed as
# unused with no reason, for a person to remove or name.
KEPT: dict[tuple[str, str], str] = {
    ("*", "logs:CreateLogStream"): "the Lambda service writes the function's own log group with its role",
    ("*", "logs:PutLogEvents"): "the Lambda service writes the function's own log group with its role",
    ("*", "xray:PutTraceSegments"): "Tracing: Active; the X-Ray daemon Lambda runs beside the function sends "
                                    "the segments with its role",
    ("*", "xray:PutTelemetryRecords"): "Tracing: Active; the X-Ray daemon sends its telemetry with the role",
    ("ExecutorFunction", "sqs:SendMessage"): "Lambda sends an executor event that failed every retry to the "
                                             "dead-letter queue with this role (EventInvokeConfig OnFailure)",
    ("StepsFunction", "states:StartExecution"): "continue-as-new, only when an execution nears Step Functions' "
                                                "25,000-event history limit; the tier's executions stay far below",
    ("StepsFunction", "states:SendTaskFailure"): "a callback handler that fails or is cancelled ends its task token "
                                                 "with it; the tier's callbacks succeed (SendTaskHeartbeat is used)",
    ("StepsFunction", "secretsmanager:GetSecretValue"): "the key of a stack that keeps it in Secrets Manager; the "
                                                        "tier's long-running jobs run on Pipelogiq, whose key is in "
                                                        "SSM (ssm:GetParameter, used)",
    ("SchedulerFunction", "dynamodb:BatchGetItem"): "the reaper reads the full ledger items the in-flight index "
                                                    "names only for a delivery stranded past its deadline; the "
                                                    "tier's deliveries settle in time",
    **{(function, "dynamodb:PutItem"): f"a {what} that finds no fresh Pipelogiq session bootstraps one: its "
                                       "lock (a conditional PutItem) and the session item; the tier's sessions "
                                       "outlive the stacks"
       for function, what in _BOOTSTRAPPERS},
    **{(function, "dynamodb:DeleteItem"): f"a {what} that bootstraps a Pipelogiq session releases the bootstrap "
                                          "lock with DeleteItem; the tier's sessions outlive the stacks"
       for function, what in _BOOTSTRAPPERS},
}

# IAM's name where it is not the API operation's.
_ACTIONS = {("lambda", "Invoke"): "lambda:InvokeFunction"}
# Condition keys a call carries from its request, where IAM defines one for the action.
_CONDITION_PARAMS = {
    "dynamodb": {"ReturnValues": "dynamodb:ReturnValues", "Select": "dynamodb:Select"},
}


# -- the template, resolved with the deployed stack's names -------------------------------------
@dataclass
class Stack:
    """One deployed stack: its CloudFormation expansion and what its names resolve to."""

    name: str
    region: str
    account: str
    parameters: dict[str, str]
    template: dict[str, Any]
    physical: dict[str, tuple[str, str]]  # logical id -> (physical id, type)

    def resolve(self, value: Any) -> Any:
        """``value`` with every intrinsic function resolved; ``_NO_VALUE`` for AWS::NoValue."""
        if isinstance(value, list):
            return [item for item in (self.resolve(v) for v in value) if item is not _NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self._ref(arg)
            if key == "Fn::GetAtt":
                logical, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return self._attribute(logical, attribute)
            if key == "Fn::Sub":
                return self._sub(arg)
            if key == "Fn::If":
                condition, yes, no = arg
                return self.resolve(yes if self.condition(condition) else no)
            if key == "Fn::Join":
                separator, parts = arg
                return separator.join(str(p) for p in self.resolve(parts))
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(items)[int(self.resolve(index))]
            if key == "Fn::Split":
                separator, text = arg
                return str(self.resolve(text)).split(separator)
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not _NO_VALUE}

    def condition(self, name: str) -> bool:
        return bool(self._truth(self.template.get("Conditions", {})[name]))

    def _truth(self, expression: Any) -> Any:
        if isinstance(expression, dict) and len(expression) == 1:
            ((key, arg),) = expression.items()
            if key == "Fn::Equals":
                left, right = (self.resolve(a) if not _is_condition_fn(a) else self._truth(a) for a in arg)
                return str(left) == str(right)
            if key == "Fn::Not":
                return not self._truth(arg[0])
            if key == "Fn::And":
                return all(self._truth(a) for a in arg)
            if key == "Fn::Or":
                return any(self._truth(a) for a in arg)
            if key == "Condition":
                return self.condition(arg)
        return self.resolve(expression)

    def _ref(self, name: str) -> Any:
        pseudo = {"AWS::Region": self.region, "AWS::AccountId": self.account, "AWS::StackName": self.name,
                  "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com"}
        if name == "AWS::NoValue":
            return _NO_VALUE
        if name in pseudo:
            return pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        declared = self.template.get("Parameters", {}).get(name)
        if declared is not None:
            return str(declared.get("Default", ""))
        physical, _ = self.physical[name]
        return physical

    def _attribute(self, logical: str, attribute: str) -> str:
        physical, kind = self.physical[logical]
        if attribute != "Arn":
            raise ValueError(f"Fn::GetAtt {logical}.{attribute}: only Arn is resolved")
        region, account = self.region, self.account
        arns = {
            "AWS::DynamoDB::Table": f"arn:aws:dynamodb:{region}:{account}:table/{physical}",
            "AWS::Logs::LogGroup": f"arn:aws:logs:{region}:{account}:log-group:{physical}:*",
            "AWS::SQS::Queue": f"arn:aws:sqs:{region}:{account}:{physical.rstrip('/').rsplit('/', 1)[-1]}",
            "AWS::Lambda::Function": f"arn:aws:lambda:{region}:{account}:function:{physical}",
            "AWS::IAM::Role": f"arn:aws:iam::{account}:role/{physical}",
        }
        if physical.startswith("arn:"):
            return physical
        if kind not in arns:
            raise ValueError(f"Fn::GetAtt {logical}.Arn: no ARN form for {kind}")
        return arns[kind]

    def _sub(self, arg: Any) -> str:
        text, names = (arg, {}) if isinstance(arg, str) else (arg[0], {k: self.resolve(v) for k, v in arg[1].items()})
        out, rest = [], text
        while "${" in rest:
            before, _, after = rest.partition("${")
            name, _, rest = after.partition("}")
            out.append(before)
            if name in names:
                out.append(str(names[name]))
            elif "." in name:
                logical, attribute = name.split(".", 1)
                out.append(self._attribute(logical, attribute))
            else:
                out.append(str(self._ref(name)))
        return "".join(out) + rest


class _NoValue:
    def __repr__(self) -> str:
        return "AWS::NoValue"


_NO_VALUE = _NoValue()


def _is_condition_fn(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in (
        "Fn::Equals", "Fn::Not", "Fn::And", "Fn::Or", "Condition")


@dataclass
class Role:
    """A function's role: its ARN and its policies, resolved (``[{"name", "policy"}]``)."""

    arn: str
    policies: list[dict[str, Any]]


def function_role(stack: Stack, function: str) -> Role:
    """The role ``function`` (a logical id) runs as, with its inline and managed policies."""
    resources = stack.template["Resources"]
    role_ref = resources[function]["Properties"]["Role"]
    role_logical = role_ref["Fn::GetAtt"][0] if isinstance(role_ref["Fn::GetAtt"], list) \
        else role_ref["Fn::GetAtt"].split(".")[0]
    props = resources[role_logical]["Properties"]
    policies = [{"name": f"{role_logical}/{p['PolicyName']}", "policy": stack.resolve(p["PolicyDocument"])}
                for p in props.get("Policies", [])]
    for managed in props.get("ManagedPolicyArns", []):
        logical = managed.get("Ref") if isinstance(managed, dict) else None
        if logical is None or resources.get(logical, {}).get("Type") != "AWS::IAM::ManagedPolicy":
            raise ValueError(f"{role_logical}: managed policy {managed!r} is not one of the stack's; "
                             "it cannot be read offline")
        policies.append({"name": logical, "policy": stack.resolve(resources[logical]["Properties"]["PolicyDocument"])})
    return Role(arn=stack.resolve(role_ref), policies=policies)


# -- calls as IAM requests ---------------------------------------------------------------------
def action_of(call: dict[str, Any]) -> str:
    return _ACTIONS.get((call["service"], call["operation"]), f"{call['service']}:{call['operation']}")


def resources_of(call: dict[str, Any], region: str, account: str) -> list[str]:
    """The ARNs the call acts on (one request each): what IAM matches ``Resource`` against."""
    service, operation, params = call["service"], call["operation"], call["params"]
    if service == "dynamodb":
        tables = params.get("RequestItems") or [params["TableName"]]
        arns = [f"arn:aws:dynamodb:{region}:{account}:table/{table}" for table in tables]
        return [f"{arn}/index/{params['IndexName']}" for arn in arns] if params.get("IndexName") else arns
    if service == "lambda":
        name = params["FunctionName"]
        arn = name if name.startswith("arn:") else f"arn:aws:lambda:{region}:{account}:function:{name}"
        return [f"{arn}:{params['Qualifier']}" if params.get("Qualifier") else arn]
    if service == "states":
        return [params["stateMachineArn"]] if params.get("stateMachineArn") else ["*"]  # task tokens: "*"
    if service == "secretsmanager":
        secret = params["SecretId"]
        return [secret if secret.startswith("arn:") else f"arn:aws:secretsmanager:{region}:{account}:secret:{secret}"]
    if service == "ssm":
        name = params["Name"]
        return [name if name.startswith("arn:") else f"arn:aws:ssm:{region}:{account}:parameter{name}"]
    if service == "sqs":
        return [f"arn:aws:sqs:{region}:{account}:{params['QueueUrl'].rstrip('/').rsplit('/', 1)[-1]}"]
    raise ValueError(f"no resource ARN rule for {service}:{operation}; add one to resources_of")


def context_of(call: dict[str, Any], role: Role, region: str) -> dict[str, Any]:
    """The condition keys the call carries: the global ones every signed request has (in
    AWS, over TLS), and the service's own from its parameters."""
    context: dict[str, Any] = {"aws:PrincipalArn": role.arn, "aws:RequestedRegion": region,
                               "aws:SecureTransport": "true", "aws:PrincipalType": "AssumedRole"}
    for param, key in _CONDITION_PARAMS.get(call["service"], {}).items():
        if isinstance(call["params"].get(param), str):
            context[key] = call["params"][param]
    return context


# -- grants --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    function: str
    policy: str
    sid: str
    action: str
    resource: str
    shown: str = ""  # the resource with the stack's names as the template's logical ids (docs' table)

    def label(self) -> str:
        return f"{self.function}: {self.action} on {self.resource} ({self.policy} {self.sid or 'statement'})"


def grants_of(function: str, role: Role, stack: Stack | None = None) -> list[Grant]:
    out: list[Grant] = []
    names = sorted(((physical, logical) for logical, (physical, _) in (stack.physical.items() if stack else [])
                    if len(physical) > 3), key=lambda pair: -len(pair[0]))
    for entry in role.policies:
        for statement in _listed(entry["policy"].get("Statement")):
            if statement.get("Effect") != "Allow":
                continue
            resources = ", ".join(_listed(statement.get("Resource")))
            shown = resources
            for physical, logical in names:
                shown = shown.replace(physical, logical)
            if stack is not None:
                shown = shown.replace(f"{stack.region}:{stack.account}:", "REGION:ACCOUNT:").replace(
                    f"::{stack.account}:", "::ACCOUNT:").replace(stack.name, "STACK")
            out += [Grant(function, entry["name"], str(statement.get("Sid", "")), action, resources, shown)
                    for action in _listed(statement.get("Action"))]
    return out


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def kept_reason(grant: Grant) -> str | None:
    return KEPT.get((grant.function, grant.action)) or KEPT.get(("*", grant.action))


# -- the proof -----------------------------------------------------------------------------------
@dataclass
class Proof:
    calls: int = 0
    functions: set[str] = field(default_factory=set)
    denied: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    grants: dict[tuple[str, str, str], Grant] = field(default_factory=dict)   # (function, sid, action)
    used: defaultdict[tuple[str, str, str], Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    ignored_keys: Counter[str] = field(default_factory=Counter)  # condition keys the evaluator found not to apply


def prove(record: dict[str, Any], node: str = "node") -> Proof:
    region, account = record["region"], record["account"]
    proof = Proof()
    requests: list[dict[str, Any]] = []
    meta: dict[str, tuple[str, dict[str, Any], Role]] = {}
    expansions: dict[tuple[str, str], dict[str, Any]] = {}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sam_to_cfn import translate  # beside this script; needs the SAM CLI's venv (samtranslator)

    logging.getLogger("samtranslator").setLevel(logging.ERROR)  # its metrics' "unpublished" notes

    for entry in record["stacks"]:
        key = (entry["template"], json.dumps(entry["parameters"], sort_keys=True))
        if key not in expansions:
            overrides = {**entry["parameters"], "AWS::StackName": entry["name"], "AWS::Region": region,
                         "AWS::AccountId": account}
            expansions[key] = translate(Path(entry["template"]), overrides)
        stack = Stack(name=entry["name"], region=region, account=account, parameters=entry["parameters"],
                      template=expansions[key],
                      physical={r["logical"]: (r["physical"], r["type"]) for r in entry["resources"]})
        for function, seen in entry["functions"].items():
            role = function_role(stack, function)
            for grant in grants_of(function, role, stack):
                proof.grants.setdefault((grant.function, grant.sid, grant.action), grant)
            for call in seen["calls"]:
                proof.calls += 1
                proof.functions.add(function)
                for resource in resources_of(call, region, account):
                    request_id = str(len(requests))
                    requests.append({"id": request_id, "principal": role.arn, "action": action_of(call),
                                     "resource": resource, "accountId": account,
                                     "context": context_of(call, role, region), "policies": role.policies})
                    meta[request_id] = (function, call, role)
    answers = _evaluate(requests, node)
    for answer in answers:
        function, call, _ = meta[answer["id"]]
        request = requests[int(answer["id"])]
        what = f"{function}: {request['action']} on {request['resource']}"
        if answer["decision"] == "Error":
            proof.errors.append(f"{what}: the evaluator refused the request: {answer['errors']}")
        elif answer["decision"] != "Allowed":
            proof.denied.append(f"{what}: {answer['decision']}")
        for key in answer.get("ignoredContextKeys", []):
            proof.ignored_keys[f"{request['action']}: {key}"] += 1
        for policy, sid in answer.get("allowedBy", []):
            for (fn, grant_sid, action), grant in proof.grants.items():
                if fn == function and grant.policy == policy and grant_sid == sid and \
                        fnmatch.fnmatchcase(request["action"].lower(), action.lower()):
                    proof.used[(fn, grant_sid, action)][f"{call['service']}.{call['operation']}"] += 1
    return proof


def _evaluate(requests: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    if not (EVALUATOR / "node_modules" / "@cloud-copilot" / "iam-simulate").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=EVALUATOR, check=True)
    done = subprocess.run([node, str(EVALUATOR / "evaluate.mjs")], input=json.dumps({"requests": requests}),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"iam: the evaluator failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    results: list[dict[str, Any]] = json.loads(done.stdout)["results"]
    return results


def report(proof: Proof, *, table: bool = False) -> int:
    unused = [grant for key, grant in sorted(proof.grants.items()) if key not in proof.used]
    named = sum(1 for grant in unused if kept_reason(grant))
    print(f"iam: {proof.calls} calls by {len(proof.functions)} functions, {len(proof.denied)} denied, "
          f"{len(unused)} grants never used ({named} kept for a named reason, {len(unused) - named} with none)")
    for line in proof.denied:
        print(f"  denied: {line}")
    for line in proof.errors:
        print(f"  error: {line}")
    for key, count in sorted(proof.ignored_keys.items()):
        print(f"  note: a condition key the evaluator says does not apply to the action ({count} calls): {key}")
    for grant in unused:
        reason = kept_reason(grant)
        why = f"kept: {reason}" if reason else "NO REASON NAMED: remove it or name why"
        print(f"  never used: {grant.label()}: {why}")
    if table:
        print("\n| function | grant | resource | used by |\n| --- | --- | --- | --- |")
        for key, grant in sorted(proof.grants.items()):
            uses = proof.used.get(key)
            used = ", ".join(f"`{op}` ({n})" for op, n in sorted(uses.items())) if uses else \
                f"not called by the code: {kept_reason(grant) or 'no reason named'}"
            print(f"| {grant.function} | `{grant.action}` | `{grant.shown or grant.resource}` | {used} |")
    return 1 if proof.denied or proof.errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", type=Path, help="the deployed tier's record (.aws-sam/deployed/aws-calls.json)")
    parser.add_argument("--node", default="node", help="the Node.js to run the evaluator with")
    parser.add_argument("--table", action="store_true", help="also print the grants table of docs/operating.md")
    args = parser.parse_args(argv)
    if not args.record.is_file():
        print(f"iam: no record at {args.record}: run `make test-deployed` first (it records every function's "
              "AWS calls)", file=sys.stderr)
        return 2
    record = json.loads(args.record.read_text())
    if not any(function["calls"] for stack in record["stacks"] for function in stack["functions"].values()):
        print(f"iam: the record at {args.record} holds no AWS call: the tier's functions logged none", file=sys.stderr)
        return 2
    return report(prove(record, args.node), table=args.table)


if __name__ == "__main__":
    raise SystemExit(main())
