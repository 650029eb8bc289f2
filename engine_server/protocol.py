"""Names on the wire between a worker (``engine_server.client``) and the engine server (``engine_server.server``),
in one place both sides import."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

OPTIONS_HEADER = "x-diarist-options"
"""Request header carrying the job options as ASCII JSON; in the URL they (the prompt) would reach access logs."""
JOB_ID_HEADER = "x-diarist-job-id"
"""Request header naming the job, so the engine server's log lines about the request carry its id."""
OPTION_FIELDS = ("language", "task", "prompt", "num_speakers", "min_speakers", "max_speakers", "multichannel")
"""Job options a worker passes to the engine (``OPTIONS_HEADER``); the rest of a job's options stay in the service."""
ADMISSION_CLASS_HEADER = "x-diarist-admission-class"
"""Request header naming the job's duration class (``short``, ``long``; absent: ``default``), which the engine
server sets on every engine sequence of the request (``Sequence.admission_class``) for per-class admission."""
PCM_HEADER = "x-diarist-pcm"
"""Request header present when the body is decoded audio, not a media file: :meth:`PcmFormat.to_header`."""


@dataclass(frozen=True)
class PcmFormat:
    """The layout of a decoded-audio body: float32 little endian, channel-major (``[channels, frames]`` in
    C order, so ``channels * frames * 4`` bytes), at ``sample_rate`` Hz, plus what the decoder learned of the
    source. The worker decodes the upload it already holds (PyAV) and sends this, so the engine process
    spends no CPU on FFmpeg beside the thread that drives the GPU.

    Attributes:
        channels, frames: the body's shape; sample_rate: Hz (the engine refuses any but its models' rate).
        source_sample_rate (Hz), source_channels, codec, container: of the uploaded file (FFmpeg names).
        nonfinite, source_values: NaN/inf sample values the decoder replaced by 0, of the values it read
            (``diarist.pcm``; the engine reports them in the result's warnings).
    """

    channels: int
    frames: int
    sample_rate: int
    source_sample_rate: int
    source_channels: int
    codec: str = ""
    container: str = ""
    nonfinite: int = 0
    source_values: int = 0

    @property
    def nbytes(self) -> int:
        """Size of the body in bytes."""
        return self.channels * self.frames * 4

    def to_header(self) -> str:
        """ASCII JSON of every field."""
        return json.dumps(asdict(self), ensure_ascii=True)

    @classmethod
    def from_header(cls, value: str) -> PcmFormat:
        """Parse :meth:`to_header`'s output.

        Raises:
            ValueError: not JSON, a missing or unknown field, a wrong type, or a non-positive count.
        """
        raw = json.loads(value)
        if not isinstance(raw, dict):
            raise ValueError("the PCM header must be a JSON object")  # noqa: TRY004 - one error type: a 400
        fmt = cls(**raw)
        ints = (fmt.channels, fmt.frames, fmt.sample_rate, fmt.source_sample_rate, fmt.source_channels)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or min(ints) < 1:
            raise ValueError(f"the PCM header's counts must be positive integers: {raw}")
        if not isinstance(fmt.codec, str) or not isinstance(fmt.container, str):
            raise ValueError("the PCM header's codec and container must be strings")  # noqa: TRY004
        counts = (fmt.nonfinite, fmt.source_values)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
            raise ValueError(f"the PCM header's nonfinite and source_values must be integers >= 0: {raw}")
        return fmt
