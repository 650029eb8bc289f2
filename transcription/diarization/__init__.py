"""Speaker diarization for models that do not emit speakers (Whisper): VAD regions ▸ window embeddings ▸
clustering ▸ turns ▸ assignment of words to speakers. See docs/diarization.md for the choices."""

from transcription.diarization.assign import assign_speakers
from transcription.diarization.channels import channel_turns, distinct_channels, label_channels
from transcription.diarization.pipeline import Turn, diarize

__all__ = ["Turn", "assign_speakers", "channel_turns", "diarize", "distinct_channels", "label_channels"]
