"""Every docstring example in the packages runs as a test (the examples are part of the docs).

Only modules whose source holds a runnable example (``>>>`` without ``+SKIP``) are collected, so no test merely imports a
module; each collected module must yield at least one example, so an example that stops being
found (a moved docstring, a broken ``__test__``) fails instead of passing silently.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["medvqa_env", "tool_backends", "rewards", "agents", "eval", "train"]


def _source(module_name: str) -> Path:
    path = ROOT.joinpath(*module_name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _modules_with_examples() -> list[str]:
    """Modules whose source holds a ``>>>`` line that is not skipped (found without importing them)."""
    names = []
    for package in PACKAGES:
        names.append(package)
        names.extend(m.name for m in pkgutil.walk_packages([str(ROOT / package)], prefix=package + "."))
    return sorted(n for n in names if _source(n).is_file() and any(
        line.lstrip().startswith(">>>") and "+SKIP" not in line for line in _source(n).read_text().splitlines()))


def test_examples_are_found():
    assert len(_modules_with_examples()) >= 10


@pytest.mark.parametrize("module_name", _modules_with_examples())
def test_docstring_examples(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, module_name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{module_name} has '>>>' in its source but doctest found no example"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {module_name}"
