"""Object stores: the local directory backend and the S3 backend against moto's S3 server on loopback."""

from __future__ import annotations

import io

import pytest

from diarist.storage import LocalStore, ObjectNotFound, S3Store


@pytest.fixture(scope="module")
def s3_endpoint():
    pytest.importorskip("moto.server", reason="moto[server] not installed")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, s3_endpoint):
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    return S3Store("diarist-test", endpoint_url=s3_endpoint, access_key_id="test", secret_access_key="test",
                   prefix="pre", create_bucket=True)


def test_round_trip_local_path_and_delete(store):
    data = bytes(range(256)) * 5000  # 1.28 MB: more than one copy chunk
    assert store.put_file("jobs/j1/audio", io.BytesIO(data)) == len(data)
    store.put_bytes("jobs/j1/transcript.json", b"{}")
    store.put_bytes("jobs/j2/audio", b"other")
    assert store.get_bytes("jobs/j1/audio") == data
    with store.local_path("jobs/j1/audio") as p:
        assert p.read_bytes() == data
    assert store.delete_prefix("jobs/j1/") == 2
    with pytest.raises(ObjectNotFound):
        store.get_bytes("jobs/j1/audio")
    with pytest.raises(ObjectNotFound), store.local_path("jobs/j1/audio"):
        pass
    assert store.get_bytes("jobs/j2/audio") == b"other"
    assert store.delete_prefix("jobs/nothing/") == 0
    store.ping()


@pytest.mark.parametrize("key", ["../etc/passwd", "/abs", "a//b", "a/./b", ""])
def test_unsafe_keys_are_rejected(store, key):
    with pytest.raises(ValueError):
        store.put_bytes(key, b"x")


def test_s3_put_streams_in_parts(s3_endpoint):
    s3 = S3Store("diarist-big", endpoint_url=s3_endpoint, access_key_id="t", secret_access_key="t",
                 create_bucket=True)

    class Source(io.RawIOBase):
        """20 MiB produced on the fly: the upload never holds it whole."""

        def __init__(self):
            self.left = 20 << 20

        def readable(self):
            return True

        def readinto(self, b):
            n = min(len(b), self.left)
            b[:n] = b"\x01" * n
            self.left -= n
            return n

    assert s3.put_file("big", io.BufferedReader(Source())) == 20 << 20
    head = s3.client.head_object(Bucket="diarist-big", Key="big")
    assert head["ContentLength"] == 20 << 20 and "-" in head["ETag"]  # a multipart upload's ETag


def test_an_unwritable_local_directory_is_a_storage_outage(tmp_path):
    """A directory that cannot be written (here a file stands where a folder must be created: permissions
    do not stop root, which CI runs as) is the store being down: DependencyUnavailable(storage), whose
    message names no server path, and ``ping`` (readyz) fails with it too."""
    import shutil

    from diarist.outages import Dependency, DependencyUnavailable, classify

    store = LocalStore(tmp_path / "objects")
    (tmp_path / "objects" / "jobs").write_bytes(b"")
    with pytest.raises(DependencyUnavailable) as err:
        store.put_file("jobs/j1/audio", io.BytesIO(b"abc"))
    assert classify(err.value) is Dependency.STORAGE and err.value.code == "storage_unavailable"
    assert str(tmp_path) not in str(err.value)
    store.ping()  # the root itself is still writable
    shutil.rmtree(tmp_path / "objects")
    (tmp_path / "objects").write_bytes(b"")
    with pytest.raises(DependencyUnavailable):
        store.ping()
    assert [p.name for p in tmp_path.iterdir()] == ["objects"]  # no probe or part file left behind


def test_an_unreadable_local_directory_is_a_storage_outage_a_missing_key_is_not(tmp_path):
    """Reading where the store's directory is gone (a file in its place, as a bad mount leaves it) is the
    store being down (503 at the API), not a 500; a key that is simply absent stays ObjectNotFound."""
    import shutil

    from diarist.outages import Dependency, DependencyUnavailable, classify

    store = LocalStore(tmp_path / "objects")
    store.put_bytes("jobs/j1/transcript.json", b"{}")
    with pytest.raises(ObjectNotFound):
        store.get_bytes("jobs/j2/transcript.json")
    shutil.rmtree(tmp_path / "objects")
    (tmp_path / "objects").write_bytes(b"")
    with pytest.raises(DependencyUnavailable) as err:
        store.get_bytes("jobs/j1/transcript.json")
    assert classify(err.value) is Dependency.STORAGE and str(tmp_path) not in str(err.value)


def test_a_missing_bucket_is_a_storage_outage_a_missing_key_is_not(s3_endpoint):
    """moto's real S3 answers: the bucket gone (deleted, or an S3 server that restarted empty) is the
    deployment's outage for every job (503 storage_unavailable at submit, backoff in the worker), while a
    missing object stays the job's own ``ObjectNotFound``."""
    from botocore.exceptions import ClientError

    from diarist.outages import Dependency, classify

    gone = S3Store("diarist-no-such-bucket", endpoint_url=s3_endpoint, access_key_id="test",
                   secret_access_key="test")
    with pytest.raises(ClientError) as err:
        gone.put_bytes("jobs/j1/audio", b"x")
    assert err.value.response["Error"]["Code"] == "NoSuchBucket"
    assert classify(err.value) is Dependency.STORAGE
    there = S3Store("diarist-test", endpoint_url=s3_endpoint, access_key_id="test", secret_access_key="test",
                    create_bucket=True)
    with pytest.raises(ObjectNotFound):
        there.get_bytes("jobs/none/audio")
    bad = ClientError({"Error": {"Code": "InvalidArgument"}, "ResponseMetadata": {"HTTPStatusCode": 400}},
                      "PutObject")
    assert classify(bad) is None  # a request we built wrong is a bug, not an outage


def test_s3_downloads_go_under_the_scratch_dir_and_leave_nothing(s3_endpoint, tmp_path):
    """``local_path`` downloads into the process's scratch directory (diarist.scratch), removed on exit."""
    scratch = tmp_path / "worker-short-1"
    scratch.mkdir()
    s3 = S3Store("diarist-scratch", endpoint_url=s3_endpoint, access_key_id="t", secret_access_key="t",
                 create_bucket=True, scratch_dir=scratch)
    s3.put_bytes("jobs/j/audio", b"abc" * 1000)
    with s3.local_path("jobs/j/audio") as p:
        assert p.parent.parent == scratch
        assert p.read_bytes() == b"abc" * 1000
    assert list(scratch.iterdir()) == []
