"""Voice preparation: a reference WAV becomes the prompt the engine speaks with.

Off the critical path, before a stream's first chunk: ``wav`` decodes and bounds the upload,
``dsp`` resamples and computes the three feature front-ends, ``host`` runs the CPU half
(the S3 speech tokenizer of ``s3onnx``, mel and fbank features), ``device`` the GPU half, and
``speaker`` the CAM++ speaker embedding (``campplus``, with CUDA graphs in
``campplus_graphs``). ``prep`` schedules both halves over a worker pool with a cache of
prepared voices, counting each outcome in ``counters``; its product is a
:class:`~minicpm_speech_runtime.voice.device.PreparedVoice`.
"""
