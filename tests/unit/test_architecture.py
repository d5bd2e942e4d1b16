"""The package's allowed imports hold, and each contract catches the import it forbids.

The contracts live in pyproject.toml (``[tool.importlinter]``) and the picture they keep in
docs/contributing/architecture.md. The first test runs ``lint-imports`` on the package as
it is; the others add one forbidden import to the package's real import graph and check
that the contract meant to stop it breaks, so a contract that stopped biting (a renamed
module, a loosened layer) fails here rather than passing quietly.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter.api import read_configuration
from importlinter.contracts.layers import LayersContract
from importlinter.contracts.private_modules import PrivateModulesContract
from importlinter.contracts.protected import ProtectedContract

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "serverless_worker"
CONFIG = read_configuration(str(ROOT / "pyproject.toml"))
CONTRACT_TYPES: dict[str, Any] = {"layers": LayersContract, "protected": ProtectedContract,
                                  "private_modules": PrivateModulesContract}


@pytest.fixture(scope="module")
def package_graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, include_external_packages=False, cache_dir=None)  # no cache in the tree


def kept(graph: grimp.ImportGraph, contract_id: str) -> bool:
    """Whether the contract ``contract_id`` of pyproject.toml holds on ``graph`` (left unchanged)."""
    options = next(c for c in CONFIG["contracts_options"] if c["id"] == contract_id)
    contract = CONTRACT_TYPES[options["type"]](
        name=options["name"], session_options=CONFIG["session_options"], contract_options=options)
    return bool(contract.check(copy.deepcopy(graph), verbose=False).kept)


def test_lint_imports_keeps_every_contract() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, check=False)

    assert result.returncode == 0, result.stdout + result.stderr
    contracts = {c["id"] for c in CONFIG["contracts_options"]}
    assert contracts == {"layers", "cli", "sandbox", "private"}
    assert f"Contracts: {len(contracts)} kept, 0 broken." in result.stdout


def test_every_contract_holds_on_the_package_as_it_is(package_graph: grimp.ImportGraph) -> None:
    assert [c["id"] for c in CONFIG["contracts_options"] if not kept(package_graph, c["id"])] == []


@pytest.mark.parametrize(("importer", "imported", "contract"), [
    # the state store keeps the model, never a protocol client; and the other way round
    ("state.items", "protocols.base", "layers"),
    ("protocols.pipelogiq", "state.store", "layers"),
    # the Lambda runtime never reaches into the local runner, the test kit or the stack tooling
    ("runtime.executor", "local.worker", "layers"),
    ("runtime.scheduler", "testing", "layers"),
    ("runtime.entry", "stack", "layers"),
    # the model is the bottom: it imports none of the packages that use it
    ("model.delivery", "protocols.base", "layers"),
    ("model.ledger", "state.items", "layers"),
    # nothing imports the command line: not the runtime, the state store or a protocol client,
    # nor a top-level module outside the layers
    ("runtime.entry", "cli", "cli"),
    ("state.store", "cli.local_command", "cli"),
    ("protocols.pipelogiq", "cli._flags", "cli"),
    ("settings", "cli._flags", "cli"),
    ("local.worker", "cli.local_command", "cli"),
    # the sandboxes: the sandbox command and the local demo only
    ("runtime.scheduler", "sandbox.admin", "sandbox"),
    ("local.worker", "sandbox", "sandbox"),
    ("cli.doctor_command", "sandbox.admin", "sandbox"),
    ("protocols.claimqueue", "sandbox.claimqueue", "sandbox"),
    # a private module is its own package's
    ("local.demo", "sandbox._server", "private"),
    ("cli.doctor_command", "protocols._session", "private"),
    ("runtime.executor", "protocols._paths", "private"),
    ("local.worker", "sandbox._validation", "private"),
])
def test_a_forbidden_import_breaks_its_contract(package_graph: grimp.ImportGraph, importer: str, imported: str,
                                                contract: str) -> None:
    graph = copy.deepcopy(package_graph)
    graph.add_import(importer=f"{PACKAGE}.{importer}", imported=f"{PACKAGE}.{imported}", line_number=1,
                     line_contents=f"from {PACKAGE}.{imported} import something")

    assert kept(package_graph, contract)
    assert not kept(graph, contract)

