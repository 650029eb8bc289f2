"""The OpenAPI schema is complete, and a bounded schemathesis run finds no 5xx and no response that breaks it.

Runs against the embedded stack's app (real DB, store, queue and engine). Examples per operation are
bounded (DIARIST_FUZZ_EXAMPLES, default 15) to keep the suite fast on 2 cores.
"""

from __future__ import annotations

import os

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis not installed")
from hypothesis import HealthCheck, settings

from tests.api.conftest import services_with

EXAMPLES = int(os.environ.get("DIARIST_FUZZ_EXAMPLES", "15"))


def test_schema_lists_every_route(stack):
    from fastapi.testclient import TestClient

    spec = TestClient(stack.app).get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/transcript", "/v1/jobs/{job_id}/events",
            "/v1/audio/transcriptions", "/healthz", "/readyz"} <= set(paths)
    assert set(paths["/v1/jobs"]) == {"get", "post"} and "delete" in paths["/v1/jobs/{job_id}"]
    post = paths["/v1/jobs"]["post"]
    assert {"multipart/form-data", "application/json"} <= set(post["requestBody"]["content"])
    assert post["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


def test_fuzz(stack):
    # schemathesis' own pytest plugin does not load under pytest 9; drive its strategies with hypothesis.
    from hypothesis import given
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    from api.app import create_app
    from diarist.apikeys import create_key

    # With keys on (the production default), so that the auth checks mean something.
    svc = services_with(stack, auth=True)
    app = create_app(svc)
    auth = {"Authorization": f"Bearer {create_key(svc.db, 'fuzz', admin=True).token}"}
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    ran = 0
    for result in schema.get_all_operations():
        op = result.ok()
        if op.path.endswith("/events"):
            continue  # an SSE stream of a live job does not end within one example

        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case) -> None:
            # A schema-valid upload is any bytes, which are rarely audio: a 422 with a code is right there.
            case.call_and_validate(headers=auth, excluded_checks=[positive_data_acceptance])

        check()
        ran += 1
    assert ran >= 7
