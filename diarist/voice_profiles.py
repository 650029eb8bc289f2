"""Voice profiles in the database: create, add samples, rename, look up, and name a transcript's speakers.

Every function takes the owner (the API key id, ``""`` with auth off) and touches only that owner's rows:
another key's profile is "not found", never "forbidden" (its existence is not disclosed). Vectors are
never logged. The API (``api.routes.speakers``) and the worker (``worker.process``) share these.

Errors are :class:`diarist.http.errors.ApiError` with stable codes (docs/service.md, Known speakers):
404 ``not_found``, 409 ``duplicate_name`` / ``profile_limit`` / ``model_mismatch``, 422 ``unknown_profile``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from diarist.contract.result import SpeakerEmbedding
from diarist.db import Database
from diarist.http.errors import ApiError
from diarist.models import SpeakerProfile, SpeakerSample, utcnow
from diarist.speakers import ProfileVoice, match, profile_vector
from diarist.transcript import SpeakerIdentity, Transcript

NAME_MAX = 200
"""Longest profile or speaker name (characters)."""
MAX_PROFILE_IDS = 100
"""Most profile ids one job may list in ``speaker_profiles``."""


def voices_key(job_id: str) -> str:
    """Object-store key of a job's speaker voice vectors (label -> :class:`SpeakerEmbedding` JSON), kept beside
    the transcript (not in it: transcripts are served, vectors never are) and deleted with the job."""
    return f"jobs/{job_id}/voices.json"


def dump_voices(voices: dict[str, SpeakerEmbedding]) -> bytes:
    """The JSON object :func:`voices_key` holds."""
    return json.dumps({k: v.to_json() for k, v in voices.items()}).encode()


def load_voices(data: bytes) -> dict[str, SpeakerEmbedding]:
    """What :func:`dump_voices` wrote. Raises ProtocolError on a malformed object."""
    return {k: SpeakerEmbedding.from_json(v, f"voice {k}") for k, v in json.loads(data).items()}


def clean_name(name: Any) -> str:
    """``name`` with its whitespace collapsed. Raises 422 ``invalid_request`` when empty or too long."""
    text = " ".join(str(name or "").split())
    if not text or len(text) > NAME_MAX:
        raise ApiError(422, "invalid_request", f"a speaker name must have 1 to {NAME_MAX} characters")
    return text


def get_profile(s: Session, owner: str, profile_id: str) -> SpeakerProfile:
    """The owner's profile. Raises 404 ``not_found`` when missing or another key's."""
    p = s.get(SpeakerProfile, profile_id)
    if p is None or p.owner_key != owner:
        raise ApiError(404, "not_found", f"no speaker profile {profile_id}")
    return p


def by_name(s: Session, owner: str, name: str) -> SpeakerProfile | None:
    """The owner's profile called ``name`` (names are unique per owner), or None."""
    return s.scalar(select(SpeakerProfile).where(SpeakerProfile.owner_key == owner, SpeakerProfile.name == name))


def _refresh(p: SpeakerProfile) -> None:
    p.vector = [float(x) for x in profile_vector([x.vector for x in p.samples], [x.seconds for x in p.samples])]
    p.sample_count = len(p.samples)
    p.sample_seconds = round(sum(x.seconds for x in p.samples), 3)
    p.updated_at = utcnow()


def add_samples(p: SpeakerProfile, samples: Sequence[tuple[SpeakerEmbedding, str]]) -> None:
    """Add ``(voice, source)`` samples to ``p`` and recompute its vector. Raises 409 ``model_mismatch`` when a
    voice was made by another embedding model than the profile's samples."""
    have = {x.source for x in p.samples if x.source.startswith("job:")}
    for voice, source in samples:
        if source in have:  # the same speaker of the same job saved again: already a sample (idempotent)
            continue
        if p.model != voice.model:
            raise ApiError(409, "model_mismatch", f"the sample's voice was made by {voice.model}; this profile's "
                           f"samples by {p.model}: create a new profile")
        p.samples.append(SpeakerSample(vector=[float(x) for x in voice.vector], seconds=float(voice.speech_s),
                                       source=source))
    _refresh(p)


def create_profile(db: Database, owner: str, name: str, samples: Sequence[tuple[SpeakerEmbedding, str]],
                   limit: int) -> str:
    """A new profile of ``samples`` (at least one); its id. Raises 409 ``duplicate_name`` (the owner has a profile of
    that name), 409 ``profile_limit`` (the owner holds ``limit`` profiles already)."""
    try:
        with db.session() as s:
            if by_name(s, owner, name) is not None:
                raise ApiError(409, "duplicate_name", f"a speaker profile named {name!r} exists; rename it, add "
                               "samples to it (PATCH), or pick another name")
            n = s.scalar(select(func.count()).select_from(SpeakerProfile).where(SpeakerProfile.owner_key == owner))
            if (n or 0) >= limit:
                raise ApiError(409, "profile_limit", f"this API key holds {n} speaker profiles, the most allowed "
                               f"(DIARIST_MAX_SPEAKER_PROFILES={limit}); delete one first")
            p = SpeakerProfile(owner_key=owner, name=name, model=samples[0][0].model, vector=[], samples=[])
            add_samples(p, samples)
            p.created_at = p.updated_at  # one instant: a new profile is never updated before it was created
            s.add(p)
            s.flush()
            return p.id
    except IntegrityError:  # a concurrent create of the same name won
        raise ApiError(409, "duplicate_name", f"a speaker profile named {name!r} exists") from None


def check_profile_ids(db: Database, owner: str, wanted: Any) -> None:
    """A job's ``speaker_profiles`` list must name the owner's profiles only. Raises 422 ``unknown_profile``."""
    if wanted in (None, "all"):
        return
    with db.session() as s:
        found = set(s.scalars(select(SpeakerProfile.id).where(SpeakerProfile.owner_key == owner,
                                                               SpeakerProfile.id.in_(list(wanted)))))
    missing = [x for x in wanted if x not in found]
    if missing:
        raise ApiError(422, "unknown_profile", f"speaker_profiles: no profile {', '.join(missing[:5])} for this key")


def profile_voices(db: Database, owner: str, wanted: Any) -> list[ProfileVoice]:
    """The owner's profiles a job asked for (``"all"`` or a list of ids; ids no longer there are skipped)."""
    with db.session() as s:
        q = select(SpeakerProfile).where(SpeakerProfile.owner_key == owner)
        if wanted != "all":
            q = q.where(SpeakerProfile.id.in_(list(wanted or [])))
        return [ProfileVoice(p.id, p.name, p.model, np.asarray(p.vector, np.float32)) for p in s.scalars(q)]


def identify(t: Transcript, profiles: Sequence[ProfileVoice], threshold: float) -> Transcript:
    """``t`` with ``identities`` for every speaker: the matched profile's name, id and score, or no name
    (:func:`diarist.speakers.match`: one-to-one, never below ``threshold``). Speakers without a voice vector
    stay unnamed."""
    labels = [x for x in t.speakers if x in t.voices]
    got = match([t.voices[x] for x in labels], profiles, threshold)
    ids = {x: SpeakerIdentity() for x in t.speakers}
    for i, m in got.items():
        ids[labels[i]] = SpeakerIdentity(name=m.name, profile_id=m.profile_id, match_score=m.score)
    t.identities = ids
    return t
