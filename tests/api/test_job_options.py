"""JobOptions refuses what it would otherwise ignore (a trial's findings)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.schemas import JobOptions


def test_speaker_profiles_on_a_multichannel_job_is_refused_not_ignored():
    with pytest.raises(ValidationError, match="multichannel job keeps no voices"):
        JobOptions(multichannel=True, speaker_profiles="all")
    assert JobOptions(multichannel=True).speaker_profiles is None


@pytest.mark.parametrize("given", ["all", "ALL", " All "])
def test_all_profiles_in_any_case(given):
    assert JobOptions(speaker_profiles=given).speaker_profiles == "all"
