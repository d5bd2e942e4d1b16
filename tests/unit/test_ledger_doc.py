"""docs/ledger.md's transition table is the code's (``state/rules.py``), written there by
scripts/ledger_doc.py; and every row of that table is a write of the store."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from serverless_worker.state import StateStore
from serverless_worker.state.rules import TRANSITIONS


def _script() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "scripts" / "ledger_doc.py"
    spec = importlib.util.spec_from_file_location("ledger_doc", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_shows_the_codes_transition_table() -> None:
    script = _script()
    text = script.DOC.read_text(encoding="utf-8")
    section = text[text.index(script.BEGIN) + len(script.BEGIN) + 1:text.index(script.END)]
    assert section == script.transitions_markdown(), "docs/ledger.md is out of date: run scripts/ledger_doc.py"
    assert script.main(["--check"]) == 0


def test_a_changed_table_is_noticed_and_rewritten_in_place() -> None:
    script = _script()
    text = script.DOC.read_text(encoding="utf-8")
    changed = script.rewrite(text, "| write |\n")
    assert changed != text
    assert changed.startswith(text[:text.index(script.BEGIN)])
    assert changed.endswith(text[text.index(script.END):])
    assert script.rewrite(changed) == text


def test_every_row_names_a_write_of_the_store() -> None:
    writes = {write for write, _ in TRANSITIONS}
    assert writes <= {name for name in vars(StateStore) if not name.startswith("_")}
    assert "store_outcome" in writes and "record_delivery" in writes
