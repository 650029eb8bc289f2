"""The typed contract between the engine side (the recording pipeline in ``transcription``, the engine
server) and the service (``api``, ``worker``, ``diarist``): one home for each name both sides use.

- :mod:`.errors`: :class:`~diarist.contract.errors.CodedError`, the base of every error that carries a
  machine ``code``, an HTTP ``status`` and a message;
- :mod:`.options`: :class:`~diarist.contract.options.TranscribeOptions`, what a caller asks of one
  transcription, and the speaker-hint rule;
- :mod:`.result`: the finish reasons, the per-request metrics and the checks a result passes when it crosses
  a process boundary;
- :mod:`.events`: the streaming events (``queued``, ``started``, ``delta``, ``segment``, ``finished``) and
  the last line (``result`` or ``error``), with their JSON form.

Standard library only (dataclasses, json): the engine server's machine has torch, numpy, transformers and
safetensors, and importing this package must need nothing more. The init imports nothing.
"""
