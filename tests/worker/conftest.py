"""A real SQLite database (migrated) and local object store for worker tests; no engine, no broker."""

from __future__ import annotations

import pytest


@pytest.fixture
def services(tmp_path):
    from diarist.services import Services
    from diarist.settings import Settings

    st = Settings.model_validate({
        **Settings().model_dump(), "embedded": True, "data_dir": tmp_path, "webhook_secret": None,
        "webhook_allow_hosts": ["127.0.0.1"], "webhook_backoff_s": 0.5, "webhook_max_attempts": 3,
        "engine_attempts": 2, "engine_retry_delay_s": 0.25})
    svc = Services.from_settings(st, migrate=True)
    yield svc
    svc.close()


@pytest.fixture
def make_job(services):
    from diarist.models import Job

    def make(**fields) -> str:
        job = Job(**{"audio_key": "jobs/x/audio", "duration_s": 1.0, **fields})
        with services.db.session() as s:
            s.add(job)
        return job.id

    return make
