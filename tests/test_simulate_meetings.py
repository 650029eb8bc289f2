"""benchmarks/simulate_meetings.py: the same seed gives the same bytes, and the RTTM says where each
talker's track has speech."""

import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "simulate_meetings", Path(__file__).resolve().parents[1] / "benchmarks" / "simulate_meetings.py")
sim = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sim  # dataclasses look their module up
_spec.loader.exec_module(sim)

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng not installed (Debian espeak-ng)")


def test_overlap_ratio_by_hand():
    # A 0-4, B 3-6, C 5-7: speech 0-7 (7 s); two or more talkers 3-4 and 5-6 (2 s)
    assert sim.overlap_ratio([("A", 0, 4), ("B", 3, 6), ("C", 5, 7)]) == pytest.approx(2 / 7)
    assert sim.overlap_ratio([("A", 0, 1), ("B", 2, 3)]) == 0.0


def test_merged_turns_join_one_talkers_overlapping_spans():
    u = sim.Utterance(np.ones(sim.SAMPLE_RATE, np.float32), "x")
    turns = [sim.Turn("A", 0.0, u), sim.Turn("A", 0.5, u), sim.Turn("B", 0.2, u), sim.Turn("A", 3.0, u)]
    assert sim.merged_turns(turns) == [("A", 0.0, 1.5), ("B", 0.2, 1.2), ("A", 3.0, 4.0)]


def test_schedule_reaches_the_target_overlap():
    rng = np.random.default_rng(1)
    utts = [(f"T{i % 3}", sim.Utterance(np.ones(int(rng.uniform(1, 4) * sim.SAMPLE_RATE), np.float32), None))
            for i in range(20)]
    for target in (0.0, 0.1, 0.25):
        turns = sim.schedule(utts, rng.uniform(0.1, 1, 20), rng.uniform(0.3, 1, 20),
                             np.arange(20) % 2 == 1, target)
        got = sim.overlap_ratio([(t.talker, t.start, t.end) for t in turns])
        assert got == pytest.approx(target, abs=0.005)


@needs_espeak
def test_same_seed_same_bytes_and_rttm_matches_tracks(tmp_path):
    a = sim.generate(tmp_path / "a", 2, seed=3, data=None, talkers=(2, 3), duration=(8, 10), n_espeak=6)
    b = sim.generate(tmp_path / "b", 2, seed=3, data=None, talkers=(2, 3), duration=(8, 10), n_espeak=6)
    assert a == b
    for row in a:
        name = row["id"].split("/")[0]
        for ext in ("wav", "rttm", "stm"):
            assert (tmp_path / "a" / name / f"{name}.{ext}").read_bytes() == \
                   (tmp_path / "b" / name / f"{name}.{ext}").read_bytes()
    assert [r["n_talkers"] for r in a] == [2, 3]

    # the same meeting again, keeping the per-talker tracks: every loud 10 ms frame of a talker lies inside
    # one of its RTTM spans, and every span starts and ends with sound of that talker
    pool = sim.talker_pool(np.random.default_rng([3, 0]), None, 6)
    rng = np.random.default_rng([3, 1, 1])
    target, dur = float(rng.uniform(0, 0.3)), float(rng.uniform(8, 10))
    mix, turns, tracks = sim.make_meeting(rng, pool, sim.Voices(None, tmp_path / "a" / "_cache"), 3, target, dur)
    name = a[1]["id"].split("/")[0]
    rttm = [line.split() for line in (tmp_path / "a" / name / f"{name}.rttm").read_text().splitlines()]
    assert sorted({r[7] for r in rttm}) == sorted(tracks)
    hop = sim.SAMPLE_RATE // 100
    for talker, x in tracks.items():
        spans = [(float(r[3]), float(r[3]) + float(r[4])) for r in rttm if r[7] == talker]
        n = x.size // hop
        energy = np.abs(x[: n * hop].reshape(n, hop)).max(1)
        loud = np.flatnonzero(energy > 1e-3)
        t = loud * 0.01
        inside = np.zeros(n, bool)
        for s, e in spans:
            inside[int(s * 100): int(np.ceil(e * 100))] = True
            assert energy[round(s * 100): round(s * 100) + 5].max() > 0
            assert energy[round(e * 100) - 5: round(e * 100)].max() > 0
        assert inside[loud].all(), f"{talker}: sound outside its turns at {t[~inside[loud]][:5]}"
    assert abs(sim.overlap_ratio([(k, s, e) for k, s, e in sim.merged_turns(turns)]) - a[1]["overlap"]) < 1e-3
    assert mix.size == next(iter(tracks.values())).size


def test_refuses_validation_items(tmp_path):
    sim.REAL_TALKERS["bad"] = ["en_ami_meeting_dev00_2spk/dev00.wav"]
    try:
        with pytest.raises(ValueError, match="validation"):
            sim.real_utterances("bad", tmp_path)
    finally:
        del sim.REAL_TALKERS["bad"]
