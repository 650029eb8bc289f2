"""What every audio model here takes as input, in a module without torch: the worker, which decodes
uploads but loads no model, imports it."""

SAMPLE_RATE = 16_000
"""Samples per second of every waveform the models take (mono float32); the pipeline resamples to it."""
