"""Batched Code2Wav runtime for MiniCPM-o 4.5 speech: model assets and reference-voice preparation.

Modules, from the bottom up:

* :mod:`.wav` decodes and validates reference WAVs (no torchaudio);
* :mod:`.dsp` holds the resampler and the three feature front-ends of the reference;
* :mod:`.host` / :mod:`.device` are the two halves of reference preparation;
* :mod:`.campplus` (+ :mod:`.campplus_graphs`) is CAM++ as a torch module fed from its ONNX file;
* :mod:`.speaker` selects the CAM++ backend (torch, ONNX Runtime, TensorRT);
* :mod:`.prep` runs preparation ahead of chunk 0 with a worker pool and a content-keyed cache,
  counted by :mod:`.counters`;
* :mod:`.assets` loads a checkpoint folder; :mod:`.checkpoint` and :mod:`.s3onnx` write
  random-weight ones; :mod:`.synth` makes synthetic voices for tests and benchmarks.

Importing this package imports nothing heavy; torch is needed by every module but :mod:`.wav`
and :mod:`.counters`.
"""
