"""The duration limit follows the model family (issue 21, item 11)."""

from __future__ import annotations

import pytest

from transcription.limits import (
    MOSS_TD_CONTEXT,
    WHISPER_MAX_DURATION_S,
    default_budget,
    max_duration_s,
    moss_td_max_duration_s,
)


def test_moss_td_limit_is_what_the_context_holds_with_the_default_budget():
    from engine.models.moss_td_prompt import build_prompt
    from engine.tokenizer import TextTokenizer
    from tests.conftest import REPO

    limit = moss_td_max_duration_s()
    assert 85 * 60 < limit < 95 * 60  # 12.5 audio + ~2 marker + 10 budget tokens per second of 131,072
    tok = TextTokenizer(REPO / "engine" / "assets" / "qwen3" / "moss_td_tokenizer.json")  # the loader's

    def need(seconds: float) -> int:
        return len(build_prompt(tok, round(seconds * 16_000)).ids) + default_budget(seconds)

    assert need(limit) <= MOSS_TD_CONTEXT < need(limit + 5.0)  # the real prompt, not the estimate
    assert moss_td_max_duration_s(context=40_960) < limit / 3  # a shorter context, a shorter limit


def test_whisper_takes_six_hours_and_unknown_families_are_refused():
    assert max_duration_s("whisper") == WHISPER_MAX_DURATION_S == 6 * 3600
    assert max_duration_s("moss-td") == moss_td_max_duration_s()
    with pytest.raises(ValueError, match="family"):
        max_duration_s("wav2vec")


@pytest.mark.parametrize("model, ok_s, refused_s", [("whisper", 5 * 3600, 6 * 3600 + 1),
                                                    ("moss-td", 89 * 60, 90 * 60)])
def test_submit_checks_the_family_limit(model, ok_s, refused_s):
    from api.intake import check_duration, duration_limit_s
    from diarist.http.errors import ApiError
    from diarist.settings import Settings

    st = Settings(model=model)
    check_duration(ok_s, st)
    with pytest.raises(ApiError) as e:
        check_duration(refused_s, st)
    assert (e.value.status, e.value.code) == (422, "too_long") and model in e.value.message
    assert duration_limit_s(Settings(model=model, max_duration_s=600.0)) == 600.0  # the setting lowers it
    assert duration_limit_s(Settings(model=model, max_duration_s=1e9)) == max_duration_s(model)  # never raises it


def test_the_api_side_stays_torch_free():
    import subprocess
    import sys

    code = "import sys, api.intake, transcription.limits; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_whisper_transcriber_refuses_past_its_bound(whisper_engine):
    from engine.request import RequestRejected
    from tests.conftest import data_file
    from transcription.transcriber import Transcriber

    tr = Transcriber(whisper_engine)
    assert tr.max_duration_s == WHISPER_MAX_DURATION_S
    tr.max_duration_s = 10.0  # on this instance only: the 11 s JFK clip is then too long
    with pytest.raises(RequestRejected) as e:
        tr.transcribe(str(data_file("en_jfk_inaugural/jfk.flac")))
    assert e.value.code == "too_long" and "lasts 11 s" in e.value.message and "at most 10 s" in e.value.message
