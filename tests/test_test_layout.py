"""The test suite's own layout: test modules named for what they test, grouped by topic, sharing
helpers through tests/support/ and fixtures through conftest.py, never through each other."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: the folders that hold what is not a test module: helpers, scripts started as processes
HELPER_DIRS = ("support", "workers", "gpu")
#: name parts that end in digits for what they are, not for an issue round
DIGIT_WORDS = {"bf16", "fp16", "fp8", "float16", "float32", "bfloat16", "int8", "int64", "e2e"}


def _python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _test_modules() -> list[Path]:
    return [p for p in _python_files() if p.name.startswith("test_")]


def _is_test_module_name(module: str) -> bool:
    """``test_x``, ``tests.test_x``, ``tests.half.test_x``, ``conftest``, ``tests.conftest``."""
    last = module.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (at any depth, and in the source of the scripts it holds
    as strings for subprocesses), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in re.finditer(r"^\s*(?:from|import)\s+([\w.]+)", node.value, re.M):
                found.append((node.lineno, m.group(1)))
    return found


def test_no_test_module_imports_another() -> None:
    bad = [f"{p.relative_to(TESTS)}:{line}: imports {module}"
           for p in _python_files() for line, module in _imports(p)
           if _is_test_module_name(module)]
    assert not bad, ("shared helpers belong in tests/support/, shared fixtures in "
                     "tests/conftest.py:\n" + "\n".join(bad))


def test_no_file_is_named_after_an_issue_or_a_round() -> None:
    bad = []
    for p in _python_files():
        words = p.stem.lower().split("_")
        if any(w in ("issue", "round") for w in words) or (
                re.search(r"\d$", words[-1]) and words[-1] not in DIGIT_WORDS):
            bad.append(str(p.relative_to(TESTS)))
    assert not bad, f"name these for what they test: {bad}"


def test_only_test_modules_and_conftest_sit_at_the_top() -> None:
    top = sorted(p.name for p in TESTS.glob("*.py")
                 if not p.name.startswith("test_") and p.name != "conftest.py")
    assert not top, f"helpers go to tests/support/, scripts started as processes to tests/workers/: {top}"
    helpers = [str(p.relative_to(TESTS)) for p in _test_modules()
               if p.relative_to(TESTS).parts[0] in HELPER_DIRS[:2]]
    assert not helpers, f"test modules among the helpers: {helpers}"


def test_test_module_names_are_unique() -> None:
    """pytest imports test modules by their file name (the folders have no __init__.py)."""
    names = Counter(p.name for p in _test_modules())
    assert not [n for n, c in names.items() if c > 1], names.most_common(3)


def test_the_layout_checks_catch_what_they_check(tmp_path: Path) -> None:
    """Each check on a file that breaks it."""
    bad = tmp_path / "test_bad.py"
    imp, frm = "import", "from"  # not written out here, where the check itself would find them
    bad.write_text(f"{imp} tests.test_models\n\ndef f():\n    {frm} test_predict {imp} TIERED\n\n"
                   f"SCRIPT = '''\n{frm} tests.conftest {imp} REPO\n'''\n")
    assert sorted(m for _, m in _imports(bad) if _is_test_module_name(m)) == [
        "test_predict", "tests.conftest", "tests.test_models"]
    assert not _is_test_module_name("tests.support.engines")
    assert re.search(r"\d$", "errors2") and "errors2" not in DIGIT_WORDS
