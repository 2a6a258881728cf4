"""Fixtures shared by every test directory.

``cluster`` is a fresh emulator per test, or, when KUBECONFIG was set before pytest started,
a fresh namespace on that real cluster (with the chart's CRD applied there). ``operator`` runs
``minicpm_speech_operator.handlers`` against it; ``operator_factory`` runs any module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import pytest
from minicpm_speech_operator import assets

from tests.harness.cluster import Cluster, emulated_cluster, real_cluster, unique_namespace
from tests.harness.crds import write_minimal_crd
from tests.harness.http import EmulatorHttp, emulator_http
from tests.harness.kopf_runner import DEFAULT_MODULE, Operator

# Read once, now: the operator fixture later points KUBECONFIG at each test's own cluster.
REAL_KUBECONFIG = os.environ.get("KUBECONFIG") or None

OperatorFactory = Callable[..., Awaitable[Operator]]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "emulator_only: a test of the emulator itself; it runs against a minimal CRD of the"
        " chart's names and is skipped when KUBECONFIG selects a real cluster",
    )
    config.addinivalue_line(
        "markers",
        "gpu: measures a CUDA device (run it on one: pytest -m gpu); skipped where there is none",
    )


def pytest_report_header() -> str:
    return f"cluster: {'real, KUBECONFIG=' + REAL_KUBECONFIG if REAL_KUBECONFIG else 'emulator'}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if REAL_KUBECONFIG:
        skip = pytest.mark.skip(reason="tests the emulator; KUBECONFIG selects a real cluster")
        for item in items:
            if item.get_closest_marker("emulator_only"):
                item.add_marker(skip)


@pytest.fixture
def crd_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The CRD the cluster serves: the chart's, or a minimal one for ``emulator_only`` tests."""
    if request.node.get_closest_marker("emulator_only"):
        return write_minimal_crd(tmp_path)
    path = assets.crd_path()
    if not path.exists():
        pytest.fail(f"the CRD is missing: {path}")
    return path


@pytest.fixture
def cluster(request: pytest.FixtureRequest, crd_path: Path, tmp_path: Path) -> Iterator[Cluster]:
    namespace = unique_namespace(request.node.name)
    if REAL_KUBECONFIG:
        with real_cluster(REAL_KUBECONFIG, crd_path, namespace) as real:
            yield real
    else:
        with emulated_cluster(crd_path, namespace, tmp_path) as emulated:
            yield emulated


@pytest.fixture
async def operator_factory(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[OperatorFactory]:
    """``await operator_factory(module=..., args=..., check_exception=...)`` starts an operator.

    Every operator started is stopped at teardown, which fails if a run raised (unless that
    operator's ``check_exception`` is False); its output is then printed, so pytest shows it
    for a failed test. While an operator runs, the process's stdout goes into its output.
    """
    # Kopf's login handler and the operator's clients read KUBECONFIG when they connect.
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig_path))
    operators: list[Operator] = []

    async def start(
        module: str = DEFAULT_MODULE,
        *,
        args: Sequence[str] = (),
        timeout: float = 60.0,
        check_exception: bool = True,
    ) -> Operator:
        operator = Operator(
            module, cluster.namespace, args=args, timeout=timeout, check_exception=check_exception
        )
        operators.append(operator)
        await operator.start()
        return operator

    yield start

    failures = []
    for operator in operators:
        if operator.running:
            try:
                await operator.stop()
            except AssertionError as failure:
                failures.append(str(failure))
        print(
            f"--- output of {operator.module} ({len(operator.runners)} runs) ---\n{operator.output}"
        )
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


@pytest.fixture
async def operator(operator_factory: OperatorFactory) -> Operator:
    """The product's operator, running against ``cluster`` and watching its namespace."""
    return await operator_factory()


@pytest.fixture
async def emulator_api(crd_path: Path) -> AsyncIterator[EmulatorHttp]:
    """An emulator served in the test's own loop, with raw HTTP access, namespaces default & ns1."""
    async with emulator_http(crd_path, ("default", "ns1")) as http:
        yield http


# A tiny random-weight Code2Wav checkpoint, written once per run: the runtime and the
# serving tests load the same one through the loader users use.


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment for a Python subprocess that imports what this interpreter imports."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from minicpm_speech_runtime.fixtures.checkpoint import TINY, write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("code2wav-tiny"), TINY, seed=0)


@pytest.fixture(scope="session")
def models(tiny_checkpoint: Path):  # type: ignore[no-untyped-def]
    from minicpm_speech_runtime.assets import load_code2wav

    return load_code2wav(tiny_checkpoint, "cpu")
