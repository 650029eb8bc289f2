"""Request dependencies (``Annotated`` aliases): services, the caller's identity, job lookup scoped to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from diarist.apikeys import authenticate
from diarist.http.errors import ApiError
from diarist.models import Job
from diarist.services import Services

bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer dia_...`")


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


@dataclass(frozen=True)
class Principal:
    """Who is calling: ``key_id`` "" when auth is off (everyone shares one space)."""

    key_id: str
    admin: bool

    def may_see(self, job: Job) -> bool:
        return self.admin or job.owner_key == self.key_id


def get_principal(services: ServicesDep,
                  creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    """401 ``unauthorized`` without a valid Bearer key when auth is enabled."""
    if not services.settings.auth_enabled:
        return Principal(key_id="", admin=True)
    if creds is None or creds.scheme.lower() != "bearer":
        raise ApiError(401, "unauthorized", "missing API key: send `Authorization: Bearer <key>`",
                       headers={"WWW-Authenticate": "Bearer"})
    key = authenticate(services.db, creds.credentials)
    if key is None:
        raise ApiError(401, "unauthorized", "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    return Principal(key_id=key.id, admin=key.admin)


PrincipalDep = Annotated[Principal, Depends(get_principal)]

JobId = Annotated[str, Path(max_length=64, description="Job id (`job_...`).")]


def load_job(services: Services, principal: Principal, job_id: str) -> Job:
    """The job, detached from its session; 404 ``not_found`` when missing or owned by another key."""
    with services.db.session() as s:
        job = s.get(Job, job_id)
        if job is None or not principal.may_see(job):
            raise ApiError(404, "not_found", f"no job {job_id}")
        _ = job.metrics
        s.expunge(job)
        return job
