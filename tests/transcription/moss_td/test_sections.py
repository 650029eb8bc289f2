"""MOSS-TD recordings longer than the context: sections cut at silences, speakers linked across sections
with the cascade's CAM++ embeddings (issue 18 item 9)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import data_file, tiny_moss_engine
from transcription.audio import Frontend, decode_audio
from transcription.moss_td.sections import link_speakers, plan_sections

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _turns(rttm: str, t0: float) -> list[tuple[str, float, float]]:
    out = []
    for line in data_file(rttm).read_text().splitlines():
        f = line.split()
        out.append((f[7], t0 + float(f[3]), t0 + float(f[3]) + float(f[4])))
    return out


def test_speakers_keep_one_label_over_sections_on_real_audio():
    """Phone call (Diane, Sheila), AMI excerpt (MEE009, MEE012), the phone call again: each section's model
    output restarts at S01 (the third section's labels swapped), the linked labels follow the people."""
    call = decode_audio(data_file("en_2spk_phonecall_pyannote_sample/sample.wav"), frontend=Frontend.LIBROSA).mono
    ami = decode_audio(data_file("en_ami_meeting_dev00_2spk/dev00.wav"), frontend=Frontend.LIBROSA).mono
    wave = np.concatenate([call, ami, call])
    parts = [_turns("en_2spk_phonecall_pyannote_sample/sample.rttm", 0.0),
             _turns("en_ami_meeting_dev00_2spk/dev00.rttm", 30.0),
             _turns("en_2spk_phonecall_pyannote_sample/sample.rttm", 60.0)]
    sections, truth = [], []
    for i, turns in enumerate(parts):
        local = {who: f"S{n + 1:02d}" for n, who in enumerate(dict.fromkeys(w for w, _, _ in turns))}
        if i == 2:  # this section's model output named them the other way round
            local = {who: ("S02" if lab == "S01" else "S01") for who, lab in local.items()}
        sections.append([{"speaker": local[w], "start": s, "end": e, "text": "x"} for w, s, e in turns])
        truth.append([w for w, _, _ in turns])
    from transcription.diarization.embedders import CamPlusPlusEmbedder
    from transcription.diarization.pipeline import THRESHOLD

    linked = link_speakers(wave, sections, CamPlusPlusEmbedder("cpu"), THRESHOLD)
    label_of: dict[str, set[str]] = {}
    for segs, people in zip(linked, truth, strict=True):
        for s, who in zip(segs, people, strict=True):
            if s["end"] - s["start"] >= 1.0:  # backchannels too short to say who they are
                label_of.setdefault(who, set()).add(s["speaker"])
    assert label_of == {"speaker90": {"S01"}, "speaker91": {"S02"}, "MEE009": {"S03"}, "MEE012": {"S04"}}


def test_sections_are_cut_in_silences_and_fit():
    wave = np.zeros(250 * 16_000, dtype=np.float32)
    speech = [(0.0, 50.0), (52.0, 85.0), (91.0, 99.0), (100.5, 180.0), (181.0, 250.0)]
    plan = plan_sections(wave, 100.0, speech)
    assert plan == [(0.0, 88.0), (88.0, 180.5), (180.5, 250.0)]  # the longest gap late in each span
    assert all(b - a <= 100.0 for a, b in plan)
    assert plan_sections(wave, 100.0, [(0.0, 250.0)]) == [(0.0, 100.0), (100.0, 200.0), (200.0, 250.0)]


def test_a_recording_past_the_context_runs_as_linked_sections_dummy_weights():
    """The plumbing on tiny dummy weights: a context of 2048 tokens holds about 100 s, so 3.5 minutes of
    meeting audio run as three sections, whose results come back as one."""
    from transcription.moss_td.pipeline import transcribe_moss
    from transcription.moss_td.sections import fits, longest_section_s

    eng = tiny_moss_engine()
    call = decode_audio(data_file("en_2spk_phonecall_pyannote_sample/sample.wav"), frontend=Frontend.LIBROSA).mono
    wave = np.tile(call, 7)  # 210 s
    assert not fits(eng, wave.size) and fits(eng, 60 * 16_000)
    assert 60 <= longest_section_s(eng) < 105

    class Opts:
        max_new_tokens = 24
        prompt = None

    events = []
    res = transcribe_moss(eng, wave, Opts(), lambda kind, payload: events.append(kind))
    assert len(res["sections"]) == 3 and res["sections"][0]["start"] == 0.0
    assert res["sections"][-1]["end"] == pytest.approx(210.0)
    assert all(b["start"] == a["end"] for a, b in zip(res["sections"], res["sections"][1:], strict=False))
    budgets = [math.ceil(24 * (x["end"] - x["start"]) / 210.0) for x in res["sections"]]  # shared in proportion
    assert res["metrics"]["output_tokens"] <= sum(budgets) and res["finish_reason"] in ("length", "stop", "repetition")
    assert all(0 <= s["start"] <= 210.0 for s in res["segments"]) and events[0] == "started"
    assert eng.allocator.num_free == eng.allocator.num_slots  # every section's KV went back
