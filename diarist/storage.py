"""Object store for uploaded audio and transcripts: a local directory or any S3-compatible bucket.

Keys are ``/``-separated relative paths (``jobs/<id>/audio``). Writes stream from a file object in chunks,
so a 1 GB upload never sits in memory; reads hand back a local file path (the worker decodes from disk).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO, Protocol

from diarist.outages import Dependency, DependencyUnavailable

CHUNK = 1 << 20


class ObjectNotFound(KeyError):
    """The key does not exist in the store."""


class ObjectStore(Protocol):
    """What the API and the workers need from a store."""

    def put_file(self, key: str, fileobj: BinaryIO) -> int:
        """Stream ``fileobj`` (from its current position) to ``key``; returns the bytes written."""

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store a small object (a transcript)."""

    def get_bytes(self, key: str) -> bytes:
        """Raises ObjectNotFound."""

    def local_path(self, key: str) -> AbstractContextManager[Path]:
        """Context manager yielding a local file path holding the object. Raises ObjectNotFound."""

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many. Missing is not an error."""

    def ping(self) -> None:
        """Raises when the store cannot be reached."""


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid object key: {key!r}")
    return key


class LocalStore:
    """Objects as files under ``root`` (embedded mode, single-host deployments)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put_file(self, key: str, fileobj: BinaryIO) -> int:
        """Raises :class:`~diarist.outages.DependencyUnavailable` (storage) when the directory cannot be
        written (permissions, read-only or full filesystem): the store is down, not the request at fault."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a reader never sees a half-written object.
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
        except OSError as e:
            raise _unwritable(e) from e
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := fileobj.read(CHUNK):  # a read error is the source's, not the store's
                    try:
                        out.write(chunk)
                    except OSError as e:
                        raise _unwritable(e) from e
                size = out.tell()
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise _unwritable(e) from e
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return size

    def put_bytes(self, key: str, data: bytes) -> None:
        import io

        self.put_file(key, io.BytesIO(data))

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(key) from None
        except OSError as e:  # the directory itself is gone or unreadable: the store's outage, not the key's
            raise DependencyUnavailable(Dependency.STORAGE, f"the object store directory cannot be read "
                                                            f"({e.strerror or type(e).__name__})") from e

    @contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFound(key)
        yield path

    def delete_prefix(self, prefix: str) -> int:
        base = self._path(prefix.rstrip("/"))
        if base.is_file():
            base.unlink()
            return 1
        if not base.is_dir():
            return 0
        n = sum(1 for p in base.rglob("*") if p.is_file())
        shutil.rmtree(base, ignore_errors=True)
        return n

    def ping(self) -> None:
        """Raises DependencyUnavailable when a file cannot be created in the directory (a real write:
        ``os.access`` says yes to root whatever the mode, and nothing about a read-only mount)."""
        try:
            fd, probe = tempfile.mkstemp(dir=self.root, prefix=".ping-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise _unwritable(e) from e


def _unwritable(e: OSError) -> DependencyUnavailable:
    # The message names the error, not the server's path: it may reach a client (readyz, logs are fine).
    return DependencyUnavailable(Dependency.STORAGE, f"the object store directory cannot be written "
                                                     f"({e.strerror or type(e).__name__})")


class _Counting:
    """A read-only view of a file object that counts the bytes read (boto3 may close what it is given)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.n = f, 0

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        self.n += len(data)
        return data


class S3Store:
    """Objects in an S3 bucket through boto3 (AWS, MinIO, moto, any S3-compatible endpoint).

    ``scratch_dir``: where :meth:`local_path` downloads objects (this process's
    :class:`diarist.scratch.Scratch` directory, so a killed worker's downloads are swept at the next
    start); None: the system temporary directory.
    """

    def __init__(self, bucket: str, *, endpoint_url: str | None = None, region: str | None = None,
                 access_key_id: str | None = None, secret_access_key: str | None = None, prefix: str = "",
                 create_bucket: bool = False, scratch_dir: Path | None = None) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.scratch_dir = scratch_dir
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.client = boto3.client(
            "s3", endpoint_url=endpoint_url, region_name=region or "us-east-1",
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
            config=Config(retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"}))
        if create_bucket:
            self._ensure_bucket()

    def _ensure_bucket(self) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self.client.create_bucket(Bucket=self.bucket)

    def _key(self, key: str) -> str:
        return self.prefix + _check_key(key)

    def put_file(self, key: str, fileobj: BinaryIO) -> int:
        counted = _Counting(fileobj)
        # upload_fileobj does a multipart upload in 8 MiB parts for large files (bounded memory).
        self.client.upload_fileobj(counted, self.bucket, self._key(key))
        return counted.n

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise ObjectNotFound(key) from None
            raise

    @contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        from botocore.exceptions import ClientError

        with tempfile.TemporaryDirectory(prefix="diarist-", dir=self.scratch_dir) as d:
            path = Path(d) / "object"
            try:
                self.client.download_file(self.bucket, self._key(key), str(path))
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    raise ObjectNotFound(key) from None
                raise
            yield path

    def delete_prefix(self, prefix: str) -> int:
        n = 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix.rstrip("/"))):
            objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if objs:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objs, "Quiet": True})
                n += len(objs)
        return n

    def ping(self) -> None:
        self.client.head_bucket(Bucket=self.bucket)


def make_store(settings, scratch_dir: Path | None = None) -> ObjectStore:
    """The store named by ``settings.storage``; an S3 store downloads into ``scratch_dir`` (see
    :class:`S3Store`)."""
    if settings.storage == "s3":
        return S3Store(settings.s3_bucket, endpoint_url=settings.s3_endpoint_url, region=settings.s3_region,
                       access_key_id=settings.s3_access_key_id, secret_access_key=settings.s3_secret_access_key,
                       prefix=settings.s3_prefix, create_bucket=settings.s3_create_bucket, scratch_dir=scratch_dir)
    return LocalStore(settings.objects_dir)
