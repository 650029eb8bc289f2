"""The MOSS-Transcribe-Diarize family's pipeline: one engine sequence for the whole recording (or one per
section past the context), its output parsed into speaker-attributed segments (``parser``)."""
