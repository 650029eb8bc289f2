"""One base for every error that reaches a caller with a machine code (API, engine server, worker).

A :class:`CodedError` carries ``code`` (a stable machine code such as ``decode_failed``), ``message`` (for
people), ``status`` (the HTTP status it answers with) and ``retryable`` (another attempt could succeed). The
API answers any of them as ``{"error": {"code", "message"}}`` with its status (``diarist.http.errors``), the engine
server sends them as its stream's ``error`` line, and the worker's engine client turns them into a job
failure, so one ``except CodedError`` replaces a list of classes at each boundary.
"""

from __future__ import annotations


class CodedError(Exception):
    """An error with a machine ``code``, a human ``message``, an HTTP ``status`` and ``retryable``.

    Subclasses set ``status`` and ``retryable`` as class attributes (defaults: 500, not retryable); a subclass
    whose instances all share one code takes only the message.
    """

    status: int = 500
    retryable: bool = False

    def __init__(self, code: str, message: str) -> None:
        # Exception's own init, not super(): a subclass may also derive from a foreign class with another
        # signature (transcription.errors.Rejected is the engine's RequestRejected too)
        Exception.__init__(self, message)
        self.code, self.message = code, message

    def to_json(self) -> dict[str, str]:
        """``{"code", "message"}``: the body of the API's error shape and of the engine stream's error line."""
        return {"code": self.code, "message": self.message}


class InvalidRequest(CodedError):
    """A request that is malformed as sent (code ``invalid_request``, 422): a wrong type, an unknown value."""

    status = 422

    def __init__(self, message: str, code: str = "invalid_request") -> None:
        super().__init__(code, message)


class ProtocolError(CodedError):
    """A line of the engine server's stream that does not follow :mod:`diarist.contract.events` (code
    ``engine_protocol``, 502, retryable: the two ends disagree, which a restarted engine may not)."""

    status = 502
    retryable = True

    def __init__(self, message: str) -> None:
        super().__init__("engine_protocol", message)
