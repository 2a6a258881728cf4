"""What the operator, the serving pod and the perf Job agree on, owned in one place.

- :mod:`.extras`: the Code2Wav connector extras of a deploy config: each key's type, range,
  default and meaning, the rules across keys, and what the batched engine refuses.
- :mod:`.supervisor`: the pod supervisor's command line, built by the operator and parsed by
  the pod.
- :mod:`.termination`: the result a perf Job leaves in its termination message.
- :mod:`.shutdown`: how long a serving pod may take to leave service: preStop, the drain bound
  derived from the longest stream, the server's grace, and the termination grace period.
- :mod:`.pod_metrics`: the serving pod's metrics an autoscaler reads, by name.
- :mod:`.paths`: walking a key path through a parsed document.
- :mod:`.allocator`: the CUDA caching allocator's settings for every process that runs the
  engine.
- :mod:`.bounded`: reading a user's YAML or JSON within limits on size, depth, nodes and
  aliases, refused before anything expands.

A leaf: it imports the standard library and PyYAML only, never torch, kopf or either side's
errors.
Each program turns the problems found here into its own error.
"""
