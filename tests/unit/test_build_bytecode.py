"""What ``sam build`` ships: every module with bytecode Lambda can use as it is.

Lambda's code directories are read-only, so a module without usable bytecode is compiled on
every cold start. The layer and the functions are built by their own Makefiles
(``BuildMethod: makefile``), which compile to ``unchecked-hash`` bytecode, and
``scripts/check_bytecode.py`` (run by ``make sam-build``) checks the build output. The
layer's recipe installs the pinned wheels for the chosen CPU (``ARCHITECTURE``), and runs
here for both; the functions' recipe installs nothing without a requirements.txt.
"""

from __future__ import annotations

import compileall
import importlib.util
import platform
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from support.layer import LEFT_OUT_OF_LAYER
from support.template import TEMPLATE_PATH, load_template

ROOT = TEMPLATE_PATH.parent
_spec = importlib.util.spec_from_file_location("check_bytecode", ROOT / "scripts" / "check_bytecode.py")
check_bytecode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_bytecode)


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "build"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (root / "app.py").write_text("import pkg\n")
    return root


def _compile(root: Path, mode: py_compile.PycInvalidationMode) -> None:
    assert compileall.compile_dir(str(root), quiet=1, force=True, invalidation_mode=mode)


def test_unchecked_hash_bytecode_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _compile(root, py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert check_bytecode.check([root]) == (2, [])
    assert check_bytecode.main([str(root)]) == 0


@pytest.mark.parametrize(("mode", "why"), [
    (py_compile.PycInvalidationMode.TIMESTAMP, "timestamped .pyc"),
    (py_compile.PycInvalidationMode.CHECKED_HASH, "checked-hash .pyc (reads every source)"),
])
def test_bytecode_that_looks_at_the_source_fails(tmp_path: Path, mode, why: str) -> None:
    root = _tree(tmp_path)
    _compile(root, mode)
    assert check_bytecode.check([root]) == (2, [f"{root / 'app.py'}: {why}", f"{root / 'pkg' / '__init__.py'}: {why}"])


def test_missing_and_stale_bytecode_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path)
    _compile(root, py_compile.PycInvalidationMode.UNCHECKED_HASH)
    (root / "app.py").write_text("import pkg  # edited after the build\n")
    (root / "late.py").write_text("")
    assert check_bytecode.check([root])[1] == [f"{root / 'app.py'}: .pyc of another version of the source",
                                               f"{root / 'late.py'}: no .pyc"]
    assert check_bytecode.main([str(root)]) == 1
    assert "2 of 3 modules would be compiled on every cold start" in capsys.readouterr().err


def test_a_directory_without_modules_is_an_error(tmp_path: Path) -> None:
    assert check_bytecode.main([str(tmp_path)]) == 1
    assert check_bytecode.main([str(tmp_path / "absent")]) == 2


def test_every_function_and_the_layer_are_built_by_their_makefile(tmp_path: Path) -> None:
    template = load_template()
    built = {rid: r for rid, r in template["Resources"].items()
             if r["Type"] in ("AWS::Serverless::Function", "AWS::Serverless::LayerVersion")}
    assert {rid: r.get("Metadata", {}).get("BuildMethod") for rid, r in built.items()} == \
        dict.fromkeys(built, "makefile")
    for rid, r in built.items():
        code = r["Properties"].get("ContentUri") or r["Properties"].get("CodeUri") or \
            template["Globals"]["Function"]["CodeUri"]
        # make itself says whether the target exists: a dry run (-n) exits 2 on "No rule"
        dry = subprocess.run(["make", "-n", "-C", str(ROOT / code), f"build-{rid}", f"ARTIFACTS_DIR={tmp_path}"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert dry.returncode == 0, f"{code}Makefile has no build-{rid} target: {dry.stderr.strip()}"


def test_the_functions_recipe_ships_the_code_root_with_bytecode(tmp_path: Path) -> None:
    out = tmp_path / "ExecutorFunction"
    out.mkdir()
    done = subprocess.run(["make", "-s", "-C", str(ROOT / "functions"), "build-ExecutorFunction",
                           f"ARTIFACTS_DIR={out}", f"PYTHON={sys.executable}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert (out / "executor" / "app.py").is_file()
    assert (out / "statemachine" / "worker.asl.json").is_file()
    assert not (out / "Makefile").exists() and not (out / "lambda-build.mk").exists()
    assert check_bytecode.check([out]) == (len(list(out.rglob("*.py"))), [])
    # the bytecode's recorded path is the one Lambda serves the code from
    code = Path(importlib.util.cache_from_source(str(out / "executor" / "app.py"))).read_bytes()
    assert b"/var/task/executor/app.py" in code


@pytest.mark.parametrize(("architecture", "elf_machine", "wheel_suffix"), [
    ("x86_64", 0x3E, "x86_64"), ("arm64", 0xB7, "aarch64")])
def test_the_layer_recipe_installs_wheels_for_the_chosen_cpu(tmp_path: Path, architecture: str, elf_machine: int,
                                                             wheel_suffix: str) -> None:
    out = tmp_path / "RuntimeLayer"
    done = subprocess.run(["make", "-s", "-C", str(ROOT / "layers" / "runtime"), "build-RuntimeLayer",
                           f"ARTIFACTS_DIR={out}", f"PYTHON={sys.executable}", f"ARCHITECTURE={architecture}"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    site = out / "python"
    # pydantic-core is compiled: its wheel's tag and its extension module name the CPU
    (wheel,) = site.glob("pydantic_core-*.dist-info/WHEEL")
    tags = [line.split(":", 1)[1].strip() for line in wheel.read_text().splitlines() if line.startswith("Tag:")]
    assert tags and all(t.startswith("cp313-cp313-") and t.endswith(wheel_suffix) for t in tags), tags
    (so,) = (site / "pydantic_core").glob("_pydantic_core*.so")
    assert int.from_bytes(so.read_bytes()[18:20], "little") == elf_machine
    assert check_bytecode.check_platform([site], architecture)[1] == []
    other = "arm64" if architecture == "x86_64" else "x86_64"
    assert any("pydantic_core" in line for line in check_bytecode.check_platform([site], other)[1])
    assert check_bytecode.main(["--architecture", architecture, str(out)]) == 0
    # the layer holds what runs in Lambda, and only that: the package less exactly its developer tooling ...
    package, source = site / "serverless_worker", ROOT / "layers" / "runtime" / "serverless_worker"
    shipped = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    missing = {p.relative_to(source).as_posix() for p in source.rglob("*.py")} - shipped
    assert missing and not any(p.startswith(tuple(f"{e}/" for e in LEFT_OUT_OF_LAYER)) or p in LEFT_OUT_OF_LAYER
                               for p in shipped)
    assert {e for e in LEFT_OUT_OF_LAYER if any(p == e or p.startswith(f"{e}/") for p in missing)} == \
        LEFT_OUT_OF_LAYER
    assert {p for p in missing if not any(p == e or p.startswith(f"{e}/") for e in LEFT_OUT_OF_LAYER)} == set()
    assert not list(site.glob("moto*")) and not list(site.glob("uvicorn*"))
    if platform.machine() != wheel_suffix:
        return  # the compiled wheels of the other CPU cannot load here
    # ... and every module in it imports from the layer alone (boto3 comes with the runtime)
    walk = ("import importlib, pkgutil, sys; sys.path.insert(0, sys.argv[1]); import serverless_worker as sw; "
            "assert sw.__file__.startswith(sys.argv[1]), sw.__file__; "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(sw.__path__, 'serverless_worker.')]")
    imported = subprocess.run([sys.executable, "-c", walk, str(site)], capture_output=True, text=True, timeout=120,
                              check=False)
    assert imported.returncode == 0, imported.stderr


@pytest.mark.parametrize(("tag", "architecture", "why"), [
    ("py3-none-any", "arm64", None),
    ("cp313-abi3-manylinux2014_aarch64", "arm64", None),
    ("cp313-cp313-manylinux_2_17_x86_64", "arm64", "not for Linux on arm64"),
    ("cp311-cp311-manylinux_2_17_x86_64", "x86_64", "built for another Python"),
    ("cp313-cp313-macosx_11_0_arm64", "arm64", "not for Linux on arm64"),
])
def test_wheel_tags_are_read_for_the_lambda_runtime(tag: str, architecture: str, why: str | None) -> None:
    problem = check_bytecode.wheel_tag_problem(tag, architecture)
    assert (problem is None) if why is None else (why in problem)


def test_the_layer_recipe_refuses_a_cpu_or_python_it_cannot_build_for(tmp_path: Path) -> None:
    recipe = ["make", "-s", "-C", str(ROOT / "layers" / "runtime"), "build-RuntimeLayer", f"ARTIFACTS_DIR={tmp_path}"]
    wrong_cpu = subprocess.run([*recipe, f"PYTHON={sys.executable}", "ARCHITECTURE=sparc"],
                               capture_output=True, text=True, timeout=60, check=False)
    assert wrong_cpu.returncode == 2 and "ARCHITECTURE must be x86_64 or arm64, not 'sparc'" in wrong_cpu.stderr
    missing = subprocess.run([*recipe, "PYTHON=/nonexistent/python3.13"], capture_output=True, text=True,
                             timeout=60, check=False)
    assert missing.returncode == 2 and "the build needs Python 3.13" in missing.stderr
    assert not any(tmp_path.iterdir()), "nothing is installed before the checks pass"
