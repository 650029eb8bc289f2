from pathlib import Path

from diarist.settings import Settings


def test_env_prefix_and_types(monkeypatch):
    monkeypatch.setenv("DIARIST_DATABASE_URL", "postgresql+psycopg://u:p@db/diarist")
    monkeypatch.setenv("DIARIST_LONG_THRESHOLD_S", "300")
    monkeypatch.setenv("DIARIST_WEBHOOK_ALLOW_HOSTS", '["127.0.0.1", "10.0.0.0/8"]')
    monkeypatch.setenv("DIARIST_STORAGE", "s3")
    st = Settings()
    assert st.db_url == "postgresql+psycopg://u:p@db/diarist"
    assert st.long_threshold_s == 300.0
    assert st.webhook_allow_hosts == ["127.0.0.1", "10.0.0.0/8"]
    assert st.storage == "s3"


def test_defaults(monkeypatch, tmp_path):
    for k in ("DIARIST_DATA_DIR", "DIARIST_EMBEDDED", "DIARIST_AUTH", "DIARIST_BROKER_URL", "DIARIST_DATABASE_URL"):
        monkeypatch.delenv(k, raising=False)
    st = Settings()
    assert st.long_threshold_s == 120.0 and st.max_duration_s is None
    assert st.broker == "redis://localhost:6379/0" and st.auth_enabled
    emb = Settings(embedded=True, data_dir=tmp_path)
    assert emb.broker.startswith("memory://") and not emb.auth_enabled
    assert emb.db_url == f"sqlite:///{(tmp_path / 'diarist.sqlite3').resolve()}"
    assert emb.objects_dir == Path(tmp_path) / "objects"
    assert Settings(embedded=True, auth=True).auth_enabled


def test_invalid_values_are_rejected_naming_the_variable(monkeypatch):
    import pytest

    from diarist.env_settings import InvalidSettings

    monkeypatch.setenv("DIARIST_STORAGE", "ftp")
    monkeypatch.setenv("DIARIST_PORT", "eighty")
    with pytest.raises(InvalidSettings) as e:
        Settings()
    assert e.value.code == "invalid_setting" and e.value.variables == ["DIARIST_STORAGE", "DIARIST_PORT"]
    assert str(e.value).startswith("DIARIST_STORAGE: Input should be 'local' or 's3' (got 'ftp'); DIARIST_PORT: ")
    monkeypatch.delenv("DIARIST_STORAGE")
    monkeypatch.delenv("DIARIST_PORT")
    monkeypatch.setenv("DIARIST_WEBHOOK_ALLOW_HOSTS", "10.0.0.1,")  # a list field that is not JSON
    with pytest.raises(InvalidSettings) as e:
        Settings()
    assert e.value.variables == ["DIARIST_WEBHOOK_ALLOW_HOSTS"]
    assert str(e.value).startswith("DIARIST_WEBHOOK_ALLOW_HOSTS: not valid JSON")


def test_a_rejected_credential_is_not_echoed(monkeypatch):
    import pytest

    from api.admin.config import AdminSettings
    from diarist.env_settings import InvalidSettings

    with pytest.raises(InvalidSettings) as e:
        AdminSettings(session_secret=["hunter2-not-a-string"])
    assert e.value.variables == ["DIARIST_ADMIN_SESSION_SECRET"] and "hunter2" not in str(e.value)


def test_admin_engine_urls_take_the_engine_url_forms(monkeypatch):
    """``DIARIST_ADMIN_ENGINE_URLS`` reads like ``DIARIST_ENGINE_URL``: comma-separated or JSON; anything
    else is an error naming the variable when the settings are read (the API's startup)."""
    import pytest

    from api.admin.config import AdminSettings
    from diarist.env_settings import InvalidSettings

    monkeypatch.delenv("DIARIST_ADMIN_ENGINE_URLS", raising=False)
    assert AdminSettings().engine_urls is None
    for raw in ("http://gpu-0:8100/, http://gpu-1:8100", '["http://gpu-0:8100", "http://gpu-1:8100"]'):
        monkeypatch.setenv("DIARIST_ADMIN_ENGINE_URLS", raw)
        assert AdminSettings().engine_urls == ["http://gpu-0:8100", "http://gpu-1:8100"]
    for bad, why in (("gpu-0:8100", "http:// or https:// with a host"), ('["http://a:1", 3]', "list of strings"),
                     ('["http://a:1"', "Expecting"), (" , ", "no engine URL")):
        monkeypatch.setenv("DIARIST_ADMIN_ENGINE_URLS", bad)
        with pytest.raises(InvalidSettings) as e:
            AdminSettings()
        assert e.value.variables == ["DIARIST_ADMIN_ENGINE_URLS"] and why in str(e.value)
        assert str(e.value).startswith("DIARIST_ADMIN_ENGINE_URLS: ")


def test_every_setting_is_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    missing = [n for n in Settings.model_fields if f"`DIARIST_{n.upper()}`" not in doc]
    assert not missing, f"document these in docs/service.md: {missing}"
    assert all(f.description for f in Settings.model_fields.values())


def test_every_admin_setting_is_documented_in_operations():
    from api.admin.config import AdminSettings

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    missing = [n for n in AdminSettings.model_fields if f"`DIARIST_ADMIN_{n.upper()}`" not in doc]
    assert not missing, f"document these in docs/operations.md: {missing}"
    assert all(f.description for f in AdminSettings.model_fields.values())


def test_worker_threads_fill_the_engine_rows(monkeypatch):
    """Unset, each transcription class gets enough threads to keep its engine rows full (docs/service.md,
    "Sizing the workers"); an explicit setting wins."""
    import pytest

    from diarist.settings import threads_to_fill

    for k in ("DIARIST_SHORT_CONCURRENCY", "DIARIST_LONG_CONCURRENCY", "DIARIST_ENGINE_MAX_RUNNING_REQUESTS",
              "DIARIST_ENGINE_LONG_MAX_RUNNING"):
        monkeypatch.delenv(k, raising=False)
    assert threads_to_fill(64) == 80 and threads_to_fill(16) == 20 and threads_to_fill(1) == 2
    assert threads_to_fill(64, seqs_per_job=6) == 14  # a 3-minute Whisper job: six windows in the engine
    assert threads_to_fill(10, engine_share=1.0) == 10
    with pytest.raises(ValueError):
        threads_to_fill(0)
    st = Settings()
    assert (st.worker_threads("short"), st.worker_threads("long"), st.worker_threads("webhooks")) == (80, 20, 4)
    monkeypatch.setenv("DIARIST_ENGINE_MAX_RUNNING_REQUESTS", "128")
    monkeypatch.setenv("DIARIST_ENGINE_LONG_MAX_RUNNING", "200")  # capped by the batch itself
    st = Settings()
    assert (st.worker_threads("short"), st.worker_threads("long")) == (160, 160)
    monkeypatch.setenv("DIARIST_SHORT_CONCURRENCY", "7")
    assert Settings().worker_threads("short") == 7
    with pytest.raises(ValueError):
        st.worker_threads("gpu")


def test_engine_url_takes_one_url_or_a_list_own_engine_first(monkeypatch):
    """DIARIST_ENGINE_URL: one URL (a list of one), URLs separated by commas, or a JSON list; order kept (the
    worker's own engine first), trailing slashes dropped; anything but http(s) URLs is refused."""
    import pytest

    from diarist.env_settings import InvalidSettings

    monkeypatch.delenv("DIARIST_ENGINE_URL", raising=False)
    assert Settings().engine_url == ["http://127.0.0.1:8100"]
    for raw in ("http://127.0.0.1:8101/, http://127.0.0.1:8100", '["http://127.0.0.1:8101", "http://127.0.0.1:8100"]'):
        monkeypatch.setenv("DIARIST_ENGINE_URL", raw)
        assert Settings().engine_url == ["http://127.0.0.1:8101", "http://127.0.0.1:8100"]
    monkeypatch.setenv("DIARIST_ENGINE_URL", "http://gpu-0:8100")
    assert Settings().engine_url == ["http://gpu-0:8100"]
    assert Settings(engine_url="http://a:1").engine_url == ["http://a:1"]
    for bad in ("", "gpu-0:8100", '["http://a:1", 3]', " , "):
        monkeypatch.setenv("DIARIST_ENGINE_URL", bad)
        with pytest.raises(InvalidSettings) as e:
            Settings()
        assert e.value.variables == ["DIARIST_ENGINE_URL"]


def test_kv_dtype_choices_are_the_engines_and_reach_its_config(monkeypatch):
    from typing import get_args

    from engine.config import KV_DTYPES

    assert get_args(Settings.model_fields["kv_dtype"].annotation) == KV_DTYPES
    monkeypatch.setenv("DIARIST_KV_DTYPE", "fp8_e4m3")
    assert Settings().engine_config().kv_dtype == "fp8_e4m3"
    assert Settings().engine_config(kv_dtype="auto").kv_dtype == "auto"  # a CLI flag wins
