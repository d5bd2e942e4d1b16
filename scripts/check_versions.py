"""Check how the stack publishes versions behind the ``live`` alias, on SAM's own transform.

Everything invokes each function's ``live`` alias, and an alias runs a published version
with the configuration it was published with. SAM publishes a new version when the code
or a function property changes (``AutoPublishAliasAllProperties``) but hashes properties
before parameter values are filled in, so a deploy that changes only a parameter would
leave ``live`` on the old configuration. ``ConfigRevision`` (``AutoPublishCodeSha256``,
which SAM does resolve) is the way to publish for it. This checks, per function:

- a ``live`` alias exists;
- a new ``ConfigRevision`` gives a new version;
- what a parameter-only change does (reported: SAM's behaviour, the reason for the above).

Run with the SAM CLI's virtualenv (it has samtranslator)::

    .venv-sam/bin/python scripts/check_versions.py template.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sam_to_cfn import translate

FUNCTIONS = ("SchedulerFunction", "ExecutorFunction", "StepsFunction", "DrainFunction")


def versions(cfn: dict[str, Any]) -> dict[str, str]:
    """function -> the logical id of its published version."""
    found = {}
    for logical, resource in cfn["Resources"].items():
        if resource["Type"] == "AWS::Lambda::Version":
            found[resource["Properties"]["FunctionName"]["Ref"]] = logical
    return found


def aliases(cfn: dict[str, Any]) -> dict[str, str]:
    """function -> its alias names."""
    found = {}
    for resource in cfn["Resources"].values():
        if resource["Type"] == "AWS::Lambda::Alias":
            found[resource["Properties"]["FunctionName"]["Ref"]] = resource["Properties"]["Name"]
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} TEMPLATE.yaml", file=sys.stderr)
        return 2
    path = Path(argv[1])
    base = translate(path, {"ConfigRevision": "1"})
    bumped = translate(path, {"ConfigRevision": "2"})
    retuned = translate(path, {"ConfigRevision": "1", "MaxInFlight": "7"})
    problems = []
    for function in FUNCTIONS:
        if aliases(base).get(function) != "live":
            problems.append(f"{function} has no live alias")
        if versions(base).get(function) == versions(bumped).get(function):
            problems.append(f"{function}: a new ConfigRevision publishes no new version")
    if problems:
        print("check_versions:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    same = all(versions(base)[f] == versions(retuned)[f] for f in FUNCTIONS)
    print(f"check_versions: {len(FUNCTIONS)} functions behind live; a new ConfigRevision publishes each; "
          f"a parameter-only change {'does not' if same else 'does'} publish by itself")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
