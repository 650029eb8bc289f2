"""The recording pipeline above the engine: audio decode, VAD, the speaker cascade, Whisper decoding
rules and alignment, the MOSS-TD prompt pipeline and parser, and the transcriber (recording ->
transcript). Imports :mod:`engine`; the engine never imports this package.
"""
