"""Every docstring example in the packages runs as a test (the examples are part of the docs)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ["medvqa_env", "tool_backends", "rewards", "agents", "eval", "train"]


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        names.append(package)
        names.extend(m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=package + "."))
    return sorted(names)


@pytest.mark.parametrize("module_name", _modules())
def test_docstring_examples(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, module_name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {module_name}"
