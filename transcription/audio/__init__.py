"""Audio input: decode any container to 16 kHz float32, log-mel features, voice activity.

``decode`` (PyAV) is imported on first use, so the VAD and the speaker cascade, which need only
``SAMPLE_RATE``, import on machines without PyAV (the GPU image).
"""

from engine.models.mel import SAMPLE_RATE, log_mel_spectrogram

__all__ = ["SAMPLE_RATE", "AudioError", "DecodedAudio", "decode_audio", "log_mel_spectrogram", "probe_duration"]


def __getattr__(name: str):
    if name in ("AudioError", "DecodedAudio", "decode_audio", "probe_duration"):
        from transcription.audio import decode

        return getattr(decode, name)
    raise AttributeError(f"module 'transcription.audio' has no attribute {name!r}")
