from pathlib import Path

from worker.routing import LONG, SHORT, queue_for


def test_duration_classes():
    assert queue_for(0.5, 120.0) == SHORT
    assert queue_for(119.99, 120.0) == SHORT
    assert queue_for(120.0, 120.0) == LONG
    assert queue_for(5400.0, 120.0) == LONG
    assert queue_for(None, 120.0) == LONG  # unknown length: never block the short queue
    assert queue_for(30.0, 10.0) == LONG


def test_celery_delivery_settings():
    from celery import Celery

    from diarist.settings import Settings
    from worker.celery_app import configure

    app = configure(Settings.model_validate({**Settings().model_dump(), "broker_url": "redis://h:1/0"}), Celery("t"))
    c = app.conf
    assert c.task_acks_late and c.task_reject_on_worker_lost and c.worker_prefetch_multiplier == 1
    assert c.broker_transport_options["visibility_timeout"] >= 3 * 3600
    assert {q.name for q in c.task_queues} == {"transcribe.short", "transcribe.long", "webhooks"}
    # kombu's Redis transport guarded against a restart under a running job (worker/redis_broker.py)
    assert c.broker_url == "diaristredis://h:1/0"


def test_filesystem_broker_keeps_its_messages_under_the_data_dir(tmp_path):
    """A one-host broker without a server: API and worker processes share the folders (kombu filesystem)."""
    from celery import Celery

    from diarist.settings import Settings
    from worker.celery_app import configure

    st = Settings.model_validate({**Settings().model_dump(), "broker_url": "filesystem://", "data_dir": tmp_path})
    conf = configure(st, Celery("t")).conf
    assert conf.broker_url == "diaristfs://"  # kombu's filesystem transport, publishing made atomic
    opts = conf.broker_transport_options
    assert opts["data_folder_in"] == opts["data_folder_out"] == str((tmp_path / "broker" / "queue").resolve())
    assert all(Path(opts[k]).is_dir() for k in ("data_folder_in", "processed_folder", "control_folder"))
    assert opts["polling_interval"] <= 0.05


def test_filesystem_broker_publishes_whole_messages_only(tmp_path, monkeypatch):
    """A consumer never sees a message file before it is complete: it is written under a name consumers
    skip and renamed into place (kombu's own transport let a consumer read it half-written)."""
    from kombu import Connection

    from worker import fs_broker

    folder = str(tmp_path)
    seen: list[list[str]] = []
    real_replace = fs_broker.os.replace

    def spy(src, dst):  # at the moment of the rename: only the temporary name exists, invisible to _get
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        real_replace(src, dst)

    with Connection(f"{fs_broker.ALIAS}://", transport_options={"data_folder_in": folder,
                                                                "data_folder_out": folder}) as conn:
        q = conn.SimpleQueue("transcribe.short")
        monkeypatch.setattr(fs_broker.os, "replace", spy)
        q.put({"job": "a" * 10_000})
        monkeypatch.undo()
        assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith(".") and seen[0][0].endswith(".tmp")
        assert q.get(timeout=2).payload == {"job": "a" * 10_000}
        q.close()
