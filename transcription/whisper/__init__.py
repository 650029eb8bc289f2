"""The Whisper family's pipeline: speech regions ▸ 30 s windows ▸ one engine sequence per window with
Whisper's decoding rules ▸ segments and word times from the alignment heads ▸ speakers from the cascade
(``transcription.diarization``)."""
