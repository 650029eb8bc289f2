"""An API over real handles (SQLite, local store, in-process bus) whose queue only records what is sent: no
worker takes a job, so it stays queued for as long as a test needs."""

from __future__ import annotations

from pathlib import Path

from diarist.models import Job

WAV = Path(__file__).resolve().parents[2] / "diarist" / "assets" / "demo_2spk_phonecall.wav"


class Dispatcher:
    """Records the jobs sent to the queue; no worker takes them."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def queue_for(self, duration_s):
        return "transcribe.short"

    def transcribe(self, job_id, queue):
        self.sent.append(job_id)

    def webhook(self, *a, **k):
        pass

    def ping(self):
        pass


def services(tmp_path, **overrides):
    """Embedded-mode services under ``tmp_path`` with the recording :class:`Dispatcher`, auth off,
    ``retry_after_s`` 7 and the settings ``overrides``."""
    from diarist.services import Services
    from diarist.settings import Settings

    st = Settings.model_validate({**Settings().model_dump(), "embedded": True, "data_dir": tmp_path, "auth": False,
                                  "retry_after_s": 7, **overrides})
    s = Services.from_settings(st, migrate=True)
    s.dispatcher = Dispatcher()
    return s


def rows(svc) -> list[Job]:
    with svc.db.session() as s:
        return list(s.query(Job))
