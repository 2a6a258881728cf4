"""The benchmark's stand-ins for ``vllm`` (a machine where vLLM cannot be installed): the names
stage-2 code imports resolve, the few with behaviour behave, anything else fails loudly when
used, and every name used is recorded. Run in a child process: the finder stays installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

CHILD = r"""
import logging, sys
from minicpm_speech_runtime.bench import vllm_stand_ins as s
assert s.install() and s.install()  # idempotent
from vllm import __version_tuple__
from vllm.logger import init_logger
from vllm.config import VllmConfig
from vllm.model_executor.models.interfaces import SupportsPP
from vllm.model_executor.models.registry import _VLLM_MODELS
from vllm.multimodal.media.audio import load_audio
from vllm.v1.sample.sampler import Sampler
assert __version_tuple__[:2] == (0, 30)
records = []
logging.basicConfig(level=logging.INFO)
class Keep(logging.Handler):
    def emit(self, record): records.append(record.getMessage())
logging.getLogger("bench").addHandler(Keep())
log = init_logger("bench")
log.warning_once("once %s", 1); log.warning_once("once %s", 1); log.info_once("other")
assert records == ["once 1", "other"], records
class Model(SupportsPP, total=False):  # a base class, with class keywords
    pass
Sampler()  # a class-level instance
assert _VLLM_MODELS == {}
try:
    from vllm.distributed import get_world_group
    get_world_group()
except RuntimeError as exc:
    assert "vllm.distributed.get_world_group is a benchmark stand-in" in str(exc)
else:
    raise AssertionError("an unexpected use must fail")
used = s.used()
assert "vllm.logger.init_logger" in used and "vllm.distributed.get_world_group" in used
assert "vllm_omni.patch (skipped)" in used
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_stand_ins_resolve_behave_and_record(child_env: dict[str, str]) -> None:
    run = subprocess.run([sys.executable, "-c", CHILD], env=child_env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok")
