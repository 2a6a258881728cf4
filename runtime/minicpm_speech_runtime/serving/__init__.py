"""The serving pod: supervisor, health and metrics endpoints, and the vLLM-Omni plugin.

* :mod:`.cli` is ``minicpm-speech-runtime serve``: it validates the pod's environment and
  deploy config, runs the MPS control daemon (:mod:`.mps`), starts ``vllm serve ... --omni``,
  gates readiness on the warm-up (:mod:`.warmup`) and serves ``/livez``, ``/readyz`` and
  ``/metrics`` (:mod:`.health`).
* :mod:`.config` parses and checks the supervisor's arguments and the deploy config.
* :mod:`.metrics` defines the runtime's Prometheus metrics (multiprocess mode).
* :mod:`.plugin` is the ``vllm_omni.general_plugins`` entry point; :mod:`.backend` is the
  Code2Wav backend it puts behind vLLM-Omni's stage 2.
* :mod:`.control` is the file protocol between the supervisor and the stage-2 process.
* :mod:`.drain` is a pod's leaving service: the API server's middleware that counts requests
  and refuses new ones while draining, and what the supervisor's drain waits for.

Nothing here imports torch or vLLM-Omni at module level except :mod:`.backend`.
"""
