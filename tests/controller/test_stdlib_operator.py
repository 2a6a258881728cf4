"""The top-level folder is named `operator`; the standard library's module must win."""

from __future__ import annotations

import subprocess
import sys

from .builders import REPO


def _assert_stdlib(module: object) -> None:
    assert hasattr(module, "itemgetter") and hasattr(module, "attrgetter")
    assert "site-packages" not in str(getattr(module, "__file__", ""))
    assert not str(getattr(module, "__file__", "")).startswith(str(REPO / "operator"))


def test_import_operator_under_pytest_is_the_standard_library() -> None:
    import operator

    _assert_stdlib(operator)


def test_import_operator_from_the_repository_root_is_the_standard_library() -> None:
    # The repository root first on sys.path is the case that would shadow it.
    code = "import operator, sys; print(operator.__file__); operator.itemgetter(0)([1])"
    for argv in ([sys.executable, "-c", code], [sys.executable, "-m", "pytest", "--version"]):
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
    printed = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.strip()
    assert not printed.startswith(str(REPO)), printed


def test_the_operator_package_imports_beside_it() -> None:
    import operator

    import minicpm_speech_operator

    assert minicpm_speech_operator.__file__ is not None
    _assert_stdlib(operator)
