"""An operator module run with Kopf's own test runner, in this process, and restartable."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import kopf
from kopf.testing import KopfRunner

DEFAULT_MODULE = "minicpm_speech_operator.handlers"


class Operator:
    """``kopf run --standalone --namespace NS -m MODULE`` in a thread of the test process.

    ``start()`` and ``stop()`` may alternate any number of times within a test; each run gets a
    fresh registry and re-imports the module, as a new process would. A run that ends with an
    exception fails ``stop()`` (and so the test's teardown) unless ``check_exception`` is False.
    """

    def __init__(
        self,
        module: str,
        namespace: str,
        *,
        args: Sequence[str] = (),
        timeout: float = 60.0,
        check_exception: bool = True,
    ) -> None:
        self.module = module
        self.namespace = namespace
        self.args = tuple(args)
        self.timeout = timeout
        self.check_exception = check_exception
        self.runners: list[KopfRunner] = []  # one per start(), the last one maybe still running
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    @property
    def output(self) -> str:
        """Everything the finished runs printed and logged (Kopf runs with --verbose)."""
        finished = self.runners[:-1] if self._running else self.runners
        return "".join(runner.output for runner in finished)

    async def start(self) -> None:
        if self._running:
            raise RuntimeError("the operator is already running")
        _forget_module(self.module)
        argv = ["run", "--standalone", "--verbose", "--namespace", self.namespace, *self.args]
        runner = KopfRunner(
            [*argv, "-m", self.module],
            registry=kopf.OperatorRegistry(),
            timeout=self.timeout,
            reraise=False,
        )
        await asyncio.to_thread(runner.__enter__)
        self.runners.append(runner)
        self._running = True

    async def stop(self) -> KopfRunner:
        if not self._running:
            raise RuntimeError("the operator is not running")
        runner = self.runners[-1]
        self._running = False
        await asyncio.to_thread(runner.__exit__, None, None, None)
        if self.check_exception and runner.exception is not None:
            tail = runner.output[-6000:]
            raise AssertionError(
                f"the operator failed: {runner.exception!r}\n{tail}"
            ) from runner.exception
        return runner

    async def restart(self) -> None:
        await self.stop()
        await self.start()


def _forget_module(module: str) -> None:
    # `kopf run -m` imports the module, and an import that is already cached runs no decorators:
    # a second run would register no handlers. Drop the module (and its submodules) first.
    for name in [name for name in sys.modules if name == module or name.startswith(f"{module}.")]:
        del sys.modules[name]
