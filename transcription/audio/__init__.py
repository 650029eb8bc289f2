"""Audio input: decode any container to 16 kHz float32, log-mel features, voice activity, and the
segmentation-3.0 network (``segmentation``, ``activity``) that speech detection and the speaker cascade
share.

``decode`` (PyAV) and the log-mel features (torch) are imported on first use, so the VAD and the speaker
cascade, which need only ``SAMPLE_RATE``, import on machines without PyAV (the GPU image), and the worker,
which decodes uploads, does not load torch.
"""

from engine.models.audio_input import SAMPLE_RATE

__all__ = ["SAMPLE_RATE", "AudioError", "DecodedAudio", "Frontend", "decode_audio", "log_mel_spectrogram",
           "probe_duration"]


def __getattr__(name: str):
    if name == "log_mel_spectrogram":
        from engine.models.mel import log_mel_spectrogram

        return log_mel_spectrogram
    if name in ("AudioError", "DecodedAudio", "Frontend"):  # numpy only: no PyAV
        from transcription.audio import samples

        return getattr(samples, name)
    if name in ("decode_audio", "probe_duration"):
        from transcription.audio import decode

        return getattr(decode, name)
    raise AttributeError(f"module 'transcription.audio' has no attribute {name!r}")
