"""Audio input: decode any container to 16 kHz float32, log-mel features, voice activity."""

from engine.audio.decode import SAMPLE_RATE, AudioError, DecodedAudio, decode_audio, probe_duration
from engine.audio.mel import log_mel_spectrogram

__all__ = ["SAMPLE_RATE", "AudioError", "DecodedAudio", "decode_audio", "log_mel_spectrogram", "probe_duration"]
