"""Stand-ins for the ``vllm`` names vLLM-Omni's stage-2 code imports, for a benchmark on a
machine where vLLM itself cannot be installed. Never used by the serving path.

:func:`install` does nothing when ``vllm`` is importable. Otherwise it puts a finder on
``sys.meta_path`` that answers every ``vllm`` and ``vllm.*`` import with an empty module whose
attributes are made on first use and recorded (:func:`used`, for the benchmark's JSON):

* a few with behaviour: ``vllm.logger.init_logger`` (a logger with the ``*_once`` methods),
  ``vllm.platforms.current_platform`` and ``vllm_omni.platforms.current_omni_platform``
  (``get_global_graph_pool`` returns one CUDA graph pool handle, ``is_cuda()`` says whether
  CUDA is available, ``is_npu()`` is false), ``vllm.config.VllmConfig``, and the reading and
  resampling of a reference WAV by vLLM-Omni's own preparation (``load_audio`` with soundfile,
  ``AudioResampler`` with the runtime's windowed sinc);
* vLLM-Omni's import-time registrations with vLLM (:data:`SKIPPED`: its patches, HF configs,
  parsers and model registry) are stand-in modules too;
* an all-capitals name is an empty dict (a registry's table), any other capitalised name an
  empty class (annotations, base classes, class-level instances); any other name a function
  that raises when called, so a use the benchmark did not expect fails loudly instead of
  computing something else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

_USED: set[str] = set()
VERSION, VERSION_TUPLE = "0.30.0", (0, 30, 0)
# vLLM-Omni's import-time registrations with vLLM (patches, HF configs, parsers)
SKIPPED = (
    "vllm_omni.patch",
    "vllm_omni.transformers_utils.configs",
    "vllm_omni.transformers_utils.parsers",
    "vllm_omni.model_executor.models.registry",
    "vllm_omni.config",
    "vllm_omni.distributed",
    "vllm_omni.distributed.omni_connectors",
    "vllm_omni.platforms",
    "vllm_omni.config.endpoint_policy",
)


class _OnceLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """vLLM's logger: the ``*_once`` methods log each distinct message once."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.getLogger(name), {})
        self._seen: set[tuple[str, str]] = set()

    def _once(self, level: str, msg: str, *args: Any, **kwargs: Any) -> None:
        if (level, msg) not in self._seen:
            self._seen.add((level, msg))
            kwargs.pop("scope", None)
            getattr(self, level)(msg, *args, **kwargs)

    def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once("info", msg, *args, **kwargs)

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once("warning", msg, *args, **kwargs)

    def debug_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once("debug", msg, *args, **kwargs)


class _Platform:
    """``vllm.platforms.current_platform``: what stage-2 code asks of it."""

    def __init__(self) -> None:
        self._pool: Any = None

    def get_global_graph_pool(self) -> Any:
        import torch

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def is_cuda(self) -> bool:
        import torch

        return bool(torch.cuda.is_available())

    def is_npu(self) -> bool:
        return False


class VllmConfig:
    """``vllm.config.VllmConfig``: a name for annotations; the benchmark passes its own."""


class AudioResampler:
    """``vllm.multimodal.audio.AudioResampler``: windowed-sinc resampling (the runtime's)."""

    def __init__(self, target_sr: int, **_: Any) -> None:
        self.target_sr = int(target_sr)

    def resample(self, audio: Any, *, orig_sr: int) -> Any:
        import torch

        from ..voice.dsp import resample

        return resample(torch.from_numpy(audio), int(orig_sr), self.target_sr).numpy()


def load_audio(path: str, sr: int | None = None, mono: bool = True) -> tuple[Any, int]:
    """``vllm.multimodal.media.audio.load_audio``: a file's float32 samples and rate."""
    import soundfile

    data, rate = soundfile.read(path, dtype="float32", always_2d=True)
    audio = data.mean(axis=1) if mono else data.T
    if sr is not None and sr != rate:
        audio, rate = AudioResampler(sr).resample(audio, orig_sr=rate), sr
    return audio, int(rate)


_PLATFORM = _Platform()
_KNOWN: dict[tuple[str, str], Any] = {
    ("vllm.logger", "init_logger"): _OnceLogger,
    ("vllm.platforms", "current_platform"): _PLATFORM,
    ("vllm.config", "VllmConfig"): VllmConfig,
    ("vllm.multimodal.audio", "AudioResampler"): AudioResampler,
    ("vllm.multimodal.media.audio", "load_audio"): load_audio,
    ("vllm_omni.platforms", "current_omni_platform"): _PLATFORM,
}


class _StandInModule(types.ModuleType):
    __version__: str  # set on the top-level ``vllm`` only
    __version_tuple__: tuple[int, int, int]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        qualified = f"{self.__name__}.{name}"
        _USED.add(qualified)
        known = _KNOWN.get((self.__name__, name))
        if known is not None:
            value = known
        elif name.strip("_").isupper():  # a constant table (a registry's models)
            value = {}
        elif name.lstrip("_")[:1].isupper():
            value = type(name, (), {
                "__init__": lambda self, *a, **k: None,
                # subclasses may pass class keywords (a TypedDict's ``total=False``)
                "__init_subclass__": classmethod(lambda cls, **kw: None),
                "__module__": self.__name__,
            })
        else:
            def value(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(f"{qualified} is a benchmark stand-in and was called")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        if spec.name == "vllm":  # the release vLLM-Omni 0.30.0 is paired with
            module.__version__, module.__version_tuple__ = VERSION, VERSION_TUPLE
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        _USED.add(module.__name__)


def install() -> bool:
    """Stand in for ``vllm`` when it is not installed; True when the stand-ins are in place."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    if importlib.util.find_spec("vllm") is not None:
        return False
    sys.meta_path.insert(0, _Finder())
    omni = importlib.util.find_spec("vllm_omni")
    roots = list(omni.submodule_search_locations or []) if omni is not None else []
    for name in SKIPPED:  # nothing to register with when there is no vLLM
        module = _StandInModule(name)
        # a package's own modules still import from its real files; only its __init__ is skipped
        parts = name.split(".")[1:]
        module.__path__ = [str(Path(r, *parts)) for r in roots if Path(r, *parts).is_dir()]
        sys.modules.setdefault(name, module)
        _USED.add(f"{name} (skipped)")
    return True


def used() -> list[str]:
    """Every stand-in module and name imported or read so far."""
    return sorted(_USED)
