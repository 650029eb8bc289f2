"""`diarist eval` metric plumbing with fake transcribers built from the references themselves.

Perfect hypotheses must score 0; a perturbed one must give the DER/JER/WER/CER/cpWER
values computed by hand in the comments.
"""

import argparse
import json
import re
from pathlib import Path

import pytest

from cli.commands import eval as eval_cmd
from diarist.contract.result import TranscriptionResult
from evaluation.harness import discover, evaluate
from evaluation.scoring import normalize_text
from tests.conftest import DATA  # ../shared/data, or DIARIST_TEST_DATA

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared test data not present")


def engine_result(segments, duration):
    return TranscriptionResult.from_json({"duration": duration, "language": "en", "model": "fake",
                                          "segments": segments, "finish_reason": "stop", "coverage": None,
                                          "no_speech": not segments, "metrics": {}})


def from_rttm(path, duration):
    """Hypothesis whose turns are exactly the RTTM's (text is a placeholder)."""
    segs = []
    for line in path.read_text().splitlines():
        f = line.split()
        segs.append({"speaker": f[7], "start": float(f[3]), "end": float(f[3]) + float(f[4]), "text": "w"})
    return engine_result(segs, duration)


def from_stm(path, duration):
    segs = []
    for line in path.read_text().splitlines():
        f = line.split(maxsplit=5)
        segs.append({"speaker": f[2], "start": float(f[3]), "end": float(f[4]), "text": f[5]})
    return engine_result(segs, duration)


# --- discovery ------------------------------------------------------------------------------


@needs_data
def test_discovery_matches_shared_references():
    items, skipped = discover(DATA)
    by = {i.id: i for i in items}
    assert skipped == []
    assert by["en_jfk_inaugural/jfk.mp3"].txt.name == "jfk.txt"
    assert by["en_jfk_inaugural/jfk.derived_aac.m4a"].txt.name == "jfk.txt"
    assert by["en_short_yes/yes_1000ms.derived_trim_0.15-0.90s.wav"].txt.name == "yes.txt"
    assert by["en_timit_LDC93S1_16k_8k_44k-stereo/LDC93S1_pcms16le_2_44100.wav"].txt.name == "LDC93S1.txt"
    assert by["multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3"].approximate
    phone = by["en_2spk_phonecall_pyannote_sample/sample.wav"]
    assert (phone.txt.name, phone.stm.name, phone.rttm.name) == ("sample.txt", "sample.stm", "sample.rttm")
    stereo = by["en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.wav"]
    assert stereo.hints == {"multichannel": True} and len(stereo.channel_txts) == 2
    assert by["en_jfk_inaugural/jfk.flac"].hints == {}
    assert len(items) == 31


# --- perfect hypotheses on the shared data ---------------------------------------------------


@needs_data
def test_perfect_turns_give_zero_der_and_jer():
    def fake(path, **hints):
        rttm = next(Path(path).parent.glob("*.rttm"))
        return from_rttm(rttm, 30.0 if "stereo" not in str(path) else 5.0)

    report = evaluate(DATA, fake, patterns=["*/*.wav"], collars=(0.0, 0.25))
    scored = [r for r in report["items"] if "der_c0" in r]
    assert {r["id"].split("/")[0] for r in scored} == {
        "en_2spk_phonecall_pyannote_sample", "en_ami_meeting_dev00_2spk", "en_ami_meeting_trn05_4spk",
        "en_ami_meeting_trn07_4spk", "en_stereo_2spk_overlap_fasterwhisper"}
    for r in scored:
        assert r["der_c0"] == pytest.approx(0, abs=1e-9), r["id"]
        assert r["der_c0.25"] == pytest.approx(0, abs=1e-9)
        assert r["jer_c0"] == pytest.approx(0, abs=1e-9)
        assert r["speaker_count_error"] == 0
    assert report["overall"]["der_c0"] == pytest.approx(0, abs=1e-9)
    assert report["overall"]["speaker_count_within_1"] == report["overall"]["speaker_count_items"] >= 5


@needs_data
def test_perfect_stm_hypothesis_gives_zero_word_errors():
    item = DATA / "en_2spk_phonecall_pyannote_sample"
    report = evaluate(DATA, lambda p, **h: from_stm(item / "sample.stm", 30.0), patterns=["en_2spk*"])
    (r,) = report["items"]
    assert r["wer"] == 0 and r["cer"] == 0 and r["cpwer"] == 0 and r["cpcer"] == 0
    assert r["ref_words"] == len(normalize_text((item / "sample.txt").read_text()).split())
    assert r["ref_speakers"] == 2 and r["hyp_speakers"] == 2
    # DER against the real RTTM is not 0 (STM times differ from RTTM turns) but well defined
    assert 0 < r["der_c0"] < 1 and r["der_c0.25"] <= r["der_c0"]


@needs_data
def test_no_speech_items_count_words_and_speakers():
    def chatty(path, **hints):
        return engine_result([{"speaker": 0, "start": 0.0, "end": 1.0, "text": "Thank you."}], 1.0)

    report = evaluate(DATA, chatty, patterns=["silence_and_noise_1s_tflite/*"])
    assert [r["hyp_words"] for r in report["items"]] == [2, 2]
    assert all(r["expected_no_speech"] and r["speaker_count_error"] == 1 for r in report["items"])
    assert report["overall"]["no_speech_items_with_words"] == 2


# --- hand-computed values on a synthetic item -------------------------------------------------


@pytest.fixture
def synthetic(tmp_path):
    d = tmp_path / "data" / "meet"
    d.mkdir(parents=True)
    (d / "m.wav").write_bytes(b"")  # never decoded: the fake transcriber ignores it
    (d / "m.txt").write_text("One two, three four.\n")
    (d / "m.stm").write_text("m 1 A 0.0 4.0 one two\nm 1 B 4.0 8.0 three four\n")
    (d / "m.rttm").write_text("SPEAKER m 1 0.000 4.000 <NA> <NA> A <NA> <NA>\n"
                              "SPEAKER m 1 4.000 4.000 <NA> <NA> B <NA> <NA>\n")
    zh = tmp_path / "data" / "zh"
    zh.mkdir()
    (zh / "z.wav").write_bytes(b"")
    (zh / "z.txt").write_text("广州市房地产中介协会分析\n")
    return tmp_path / "data"


def perturbed(path, **hints):
    if Path(path).stem == "z":  # one substituted character of 12
        return engine_result([{"speaker": 0, "start": 0.0, "end": 4.0, "text": "广州市 房地产中介协会分洗。"}], 4.3)
    return engine_result([{"speaker": 7, "start": 0.0, "end": 5.0, "text": "one too"},
                          {"speaker": 3, "start": 5.0, "end": 8.0, "text": "three four"},
                          {"speaker": 3, "start": 9.5, "end": 10.0, "text": "five"}], 10.0)


def test_hand_computed_values(synthetic):
    report = evaluate(synthetic, perturbed, collars=(0.0, 0.25))
    by = {r["id"]: r for r in report["items"]}
    m = by["meet/m.wav"]
    # ref A 0-4, B 4-8; hyp X 0-5, Y 5-8 + 9.5-10. Mapping X->A, Y->B.
    # collar 0: confusion 4-5 (1 s) + false alarm 9.5-10 (0.5 s) over 8 s of reference = 0.1875
    assert m["der_c0"] == pytest.approx(1.5 / 8)
    assert m["der_c0_detail"] == pytest.approx({"missed": 0, "false_alarm": 0.5, "confusion": 1.0, "total": 8.0,
                                                "missed_speech": 0, "missed_overlap": 0, "overlap": 0,
                                                "overlap_two_speakers": 0})
    # collar 0.25 s each side of 0, 4, 8 removes 0.25 + 0.5 + 0.25 s of reference and 4-4.25 of confusion:
    # (0.75 + 0.5) / 7 = 0.178571...
    assert m["der_c0.25"] == pytest.approx(1.25 / 7)
    # JER: A vs X = 1 - 4/5; B vs Y = 1 - 3/4.5; mean = 0.26667
    assert m["jer_c0"] == pytest.approx(((1 - 4 / 5) + (1 - 3 / 4.5)) / 2)
    # words: "one two three four" vs "one too three four five": 1 sub + 1 ins over 4
    assert m["wer"] == pytest.approx(0.5) and (m["wer_errors"], m["ref_words"]) == (2, 4)
    # nothing of the reference is lost (one substitution, one insertion), and every item counts its words
    assert (m["wer_deletions"], m["hyp_words"]) == (0, 5)
    # chars: 18 reference chars; "two"->"too" 1 sub, " five" 5 ins
    assert m["cer"] == pytest.approx(6 / 18)
    # cp: A<->X "one two"/"one too" 1 error, B<->Y "three four"/"three four five" 1 error, over 4 words
    assert m["cpwer"] == pytest.approx(0.5)
    assert (m["ref_speakers"], m["hyp_speakers"], m["speaker_count_error"]) == (2, 2, 0)
    z = by["zh/z.wav"]
    assert z["scoring"] == "chars" and z["wer"] is None and z["cer"] == pytest.approx(1 / 12)
    o = report["overall"]
    assert o["cer"] == pytest.approx((6 + 1) / (18 + 12))
    assert o["wer"] == pytest.approx(0.5)
    assert o["der_c0"] == pytest.approx(1.5 / 8)
    assert o["rtf"] is not None and o["audio_s"] == pytest.approx(14.3)


def test_overlap_split_and_speaker_count_by_hand(tmp_path, capsys):
    d = tmp_path / "data" / "ov"
    d.mkdir(parents=True)
    (d / "o.wav").write_bytes(b"")
    (d / "o.rttm").write_text("SPEAKER o 1 0.000 6.000 <NA> <NA> A <NA> <NA>\n"
                              "SPEAKER o 1 4.000 4.000 <NA> <NA> B <NA> <NA>\n")

    def hyp(path, **hints):  # X 0-5, Y 4.5-7.5, Z 9-9.5: one talker too many, overlap half found
        return engine_result([{"speaker": 0, "start": 0.0, "end": 5.0, "text": "w"},
                              {"speaker": 1, "start": 4.5, "end": 7.5, "text": "w"},
                              {"speaker": 2, "start": 9.0, "end": 9.5, "text": "w"}], 10.0)

    report = evaluate(tmp_path / "data", hyp, collars=(0.0, 0.25))
    r = report["items"][0]
    # collar 0 (reference A 0-6, B 4-8: 10 s of speech, overlap 4-6): 4-4.5 and 5-6 have one hypothesis
    # speaker for two (missed overlap 1.5 s), 7.5-8 none (missed speech 0.5 s), 9-9.5 false alarm; X->A, Y->B
    # leave no confusion. DER = (1.5 + 0.5 + 0.5) / 10; two hypothesis speakers on 4.5-5 of the 2 s overlap.
    assert r["der_c0"] == pytest.approx(0.25)
    assert r["der_c0_detail"] == pytest.approx({"missed": 2.0, "false_alarm": 0.5, "confusion": 0.0, "total": 10.0,
                                                "missed_speech": 0.5, "missed_overlap": 1.5, "overlap": 2.0,
                                                "overlap_two_speakers": 0.5})
    # collar 0.25 cuts 0-0.25, 3.75-4.25, 5.75-6.25, 7.75-8.25: 8 s of speech; overlap left 4.25-5.75 (1.5 s),
    # one speaker short on 4.25-4.5 and 5-5.75 (1.0 s), none on 7.5-7.75 (0.25 s), false alarm 0.5 s
    assert r["der_c0.25"] == pytest.approx(1.75 / 8)
    det = r["der_c0.25_detail"]
    assert (det["missed_overlap"], det["missed_speech"], det["overlap"], det["overlap_two_speakers"]) == \
        pytest.approx((1.0, 0.25, 1.5, 0.5))
    assert det["missed"] == pytest.approx(det["missed_speech"] + det["missed_overlap"])
    o = report["overall"]
    assert (o["der_c0_missed_speech"], o["der_c0_missed_overlap"], o["der_c0_false_alarm"],
            o["der_c0_confusion"]) == pytest.approx((0.05, 0.15, 0.05, 0.0))
    assert o["overlap_c0_two_speakers"] == pytest.approx(0.25) and o["overlap_c0.25_two_speakers"] == pytest.approx(1 / 3)
    assert (r["speaker_count_error"], o["speaker_count_exact"], o["speaker_count_error_mean"]) == (1, 0, 1)
    line = eval_cmd.speaker_line(o, [0.0, 0.25])
    assert "missed overlap 15.0%" in line and "overlap given 2 speakers 25.0% of 2.0 s" in line
    assert line.endswith("speaker count exact 0/1, mean error +1.00")


# --- bad input never ends in a traceback ------------------------------------------------------


def test_bad_references_and_failing_transcriber_give_messages(tmp_path):
    d = tmp_path / "data" / "bad"
    d.mkdir(parents=True)
    (d / "a.wav").write_bytes(b"")
    (d / "a.rttm").write_text("SPEAKER a 1 zero one <NA> <NA> A\n")
    (d / "a.stm").write_text("this is not an stm line\n")
    (d / "b.wav").write_bytes(b"")
    (d / "b.txt").write_bytes(b"\xff\xfe\x00bad")
    (d / "c.wav").write_bytes(b"")
    (d / "c.txt").write_text("hello")
    (d / "e.wav").write_bytes(b"")
    (d / "e.stm").write_text("e 1 A 0 1 ?\n")
    (d / "e.rttm").write_text("SPEAKER e 1 0.0 1.0 <NA> <NA> A <NA> <NA>\n")
    (d / "f.wav").write_bytes(b"")
    (d / "f.rttm").write_text("SPEAKER f 1 0.0 1.0 <NA> <NA> A <NA> <NA>\nSPEAKER f 1 2.0 -0.5 <NA> <NA> B <NA> <NA>\n")

    def fake(path, **hints):
        if Path(path).stem == "c":
            raise RuntimeError("decoder exploded")
        return engine_result([{"speaker": 0, "start": 0.0, "end": 1.0, "text": "hi"}], 2.0)

    report = evaluate(tmp_path / "data", fake)
    by = {r["id"]: r for r in report["items"]}
    errs = " ".join(by["bad/a.wav"]["reference_errors"])
    assert "RTTM" in errs and "a.rttm" in errs and "STM" in errs and "a.stm" in errs
    assert "cannot read transcript" in by["bad/b.wav"]["reference_errors"][0]
    assert by["bad/c.wav"]["error"] == "RuntimeError: decoder exploded"
    # an STM without words cannot be scored, but the RTTM of the same item still is
    assert by["bad/e.wav"]["reference_errors"] == [
        "cpWER scoring failed: ReferenceFileError: the speaker-attributed reference has no words after normalisation"]
    assert by["bad/e.wav"]["der_c0"] == 0 and by["bad/e.wav"]["speaker_count_error"] == 0
    # a and b have no usable reference: reported without transcribing; c failed in the transcriber
    assert by["bad/a.wav"]["error"].startswith("no usable reference file: ")
    # a turn with a negative duration is named, line and values, and the item is not scored on it
    assert by["bad/f.wav"]["reference_errors"] == [
        f"RTTM file {d / 'f.rttm'} line 2: a turn needs onset >= 0 and duration > 0, got onset 2.0 and duration -0.5"]
    assert by["bad/f.wav"]["error"].startswith("no usable reference file: ")
    assert report["overall"]["failed"] == 4
    assert report["not_scored"] == []  # every audio file had a reference (bad ones are item errors)
    (d / "g.rttm").write_text("SPEAKER g 1 0.0 1.0 <NA> <NA> A <NA> <NA>\n")  # its audio is missing
    assert evaluate(tmp_path / "data", fake)["unmatched_references"] == ["bad/g.rttm"]

    with pytest.raises(FileNotFoundError, match="data directory not found"):
        evaluate(tmp_path / "nope", fake)


def test_invalid_engine_result_is_an_item_error(synthetic):
    report = evaluate(synthetic, lambda p, **h: TranscriptionResult.from_json({"segments": []}), patterns=["meet/*"])
    assert "duration" in report["items"][0]["error"]


# --- CLI --------------------------------------------------------------------------------------


def test_cli_save_and_replay_round_trip(synthetic, tmp_path, capsys):
    saved = tmp_path / "hyps"
    parser = argparse.ArgumentParser(prog="diarist")
    sub = parser.add_subparsers(dest="command")
    eval_cmd.add_parser(sub)
    args = parser.parse_args(["eval", str(synthetic), "--save-hyp", str(saved), "--out", str(tmp_path / "r1.json")])
    assert args.func(args, transcribe_fn=perturbed) == 0
    assert sorted(p.name for p in saved.iterdir()) == ["meet__m.wav.json", "zh__z.wav.json"]
    # re-score the saved results without any transcriber
    assert eval_cmd.main([str(synthetic), "--hyp-dir", str(saved), "--out", str(tmp_path / "r2.json")]) == 0
    r1, r2 = (json.loads((tmp_path / n).read_text()) for n in ("r1.json", "r2.json"))
    for key in ("wer", "cer", "cpwer", "der_c0", "der_c0.25"):
        assert r1["overall"][key] == r2["overall"][key]
    assert r2["overall"]["rtf"] is None  # saved fake results carry no processing_s
    out = capsys.readouterr().out
    assert "meet/m.wav" in out and "overall:" in out
    assert r1["git_commit"] is None or len(r1["git_commit"]) == 40


def test_cli_usage_errors(tmp_path, capsys):
    assert eval_cmd.main([str(tmp_path / "missing")]) == 2
    assert "data directory not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert eval_cmd.main([str(tmp_path / "empty"), "--hyp-dir", str(tmp_path)]) == 2
    assert "no items with reference files" in capsys.readouterr().err
    assert eval_cmd.main([str(tmp_path / "empty"), "--hyp-dir", str(tmp_path / "nope")]) == 2
    assert "--hyp-dir not found" in capsys.readouterr().err
    for bad in ("-1", "nan", "x"):
        with pytest.raises(SystemExit) as e:
            eval_cmd.main([str(tmp_path), "--collar", bad])
        assert e.value.code == 2 and "--collar" in capsys.readouterr().err


def test_cli_out_that_is_a_directory_is_a_usage_error(synthetic, tmp_path, capsys):
    called = []

    def transcriber(*a, **k):
        called.append(a)
        return perturbed(*a, **k)

    parser = argparse.ArgumentParser(prog="diarist")
    eval_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", str(synthetic), "--out", str(tmp_path)])
    assert args.func(args, transcribe_fn=transcriber) == 2
    assert "--out is a directory" in capsys.readouterr().err
    assert not called  # refused before any item is transcribed


# --- nothing skipped silently; speaker-attributed .txt; pooling as the scorers pool --------------------


def test_every_audio_file_is_scored_or_listed_with_its_reason(tmp_path, capsys):
    d = tmp_path / "data"
    (d / "ok").mkdir(parents=True)
    (d / "ok" / "a.wav").write_bytes(b"")
    (d / "ok" / "a.txt").write_text("hello there\n")
    (d / "renamed").mkdir()
    (d / "renamed" / "meeting.wav").write_bytes(b"")
    (d / "renamed" / "meeting_ref.rttm").write_text("SPEAKER x 1 0.0 1.0 <NA> <NA> A <NA> <NA>\n")
    (d / "bare").mkdir()
    (d / "bare" / "song.ogg").write_bytes(b"")
    report = evaluate(d, lambda p, **h: engine_result([{"speaker": 0, "start": 0.0, "end": 1.0, "text": "hello"}],
                                                      2.0))
    assert [r["id"] for r in report["items"]] == ["ok/a.wav"]
    reasons = {n["id"]: n["reason"] for n in report["not_scored"]}
    assert set(reasons) == {"renamed/meeting.wav", "bare/song.ogg"}
    assert reasons["renamed/meeting.wav"].startswith("name mismatch: meeting_ref.rttm beside it match no audio")
    assert reasons["bare/song.ogg"] == "no reference file (.txt, .stm, .rttm or .speakers.txt) beside it"
    assert report["unmatched_references"] == ["renamed/meeting_ref.rttm"]
    # the CLI prints them in its table, not only in the JSON
    parser = argparse.ArgumentParser(prog="diarist")
    eval_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", str(d)])
    assert args.func(args, transcribe_fn=lambda p, **h: engine_result([], 2.0)) == 0
    out = capsys.readouterr().out
    assert "renamed/meeting.wav" in out and "not scored: name mismatch" in out and "2 not scored" in out


def test_speakers_txt_makes_the_transcript_speaker_attributed(tmp_path):
    d = tmp_path / "data" / "call"
    d.mkdir(parents=True)
    (d / "c.wav").write_bytes(b"")
    (d / "c.txt").write_text("Hello, this is Ann.\nHi Ann, Bob here.\nHow are you?\n")
    (d / "c.speakers.txt").write_text("ann\nbob\nann\n")
    (d / "bad.wav").write_bytes(b"")
    (d / "bad.txt").write_text("one line\ntwo lines\n")
    (d / "bad.speakers.txt").write_text("a\n")

    def hyp(path, **hints):  # right words, but "hi ann" given to the first speaker
        return engine_result([{"speaker": 1, "start": 0.0, "end": 2.0, "text": "Hello, this is Ann. Hi Ann,"},
                              {"speaker": 2, "start": 2.0, "end": 3.0, "text": "Bob here."},
                              {"speaker": 1, "start": 3.0, "end": 4.0, "text": "How are you?"}], 4.0)

    report = evaluate(tmp_path / "data", hyp)
    by = {r["id"]: r for r in report["items"]}
    c = by["call/c.wav"]
    assert c["wer"] == 0 and c["cp_reference"] == "speakers.txt" and c["ref_speakers"] == 2
    # ann: "hello this is ann how are you" (7) vs "hello this is ann hi ann how are you": 2 insertions;
    # bob: "hi ann bob here" (4) vs "bob here": 2 deletions -> 4 errors over 11 words
    assert (c["cpwer_errors"], c["cp_ref_words"]) == (4, 11) and c["cpwer"] == pytest.approx(4 / 11)
    assert report["unmatched_references"] == []  # the speakers files are used, not strays
    bad = by["call/bad.wav"]
    want = (f"speakers file {d / 'bad.speakers.txt'} has 1 labels for the 2 lines of its transcript "
            "(one label per transcript line, in order)")
    assert bad["reference_errors"] == [want]
    assert bad["wer"] is not None and bad.get("cpwer") is None  # WER still scored from the .txt


def test_speakers_txt_in_the_speaker_colon_text_form_is_the_transcript(tmp_path):
    """``speaker: text`` lines are read as a speaker-attributed transcript of their own (no ``.txt``
    needed, the labels never counted as words); bare labels without a transcript, and mixed forms, are
    reported."""
    d = tmp_path / "data" / "call"
    d.mkdir(parents=True)
    (d / "c.wav").write_bytes(b"")
    (d / "c.speakers.txt").write_text("Ann: Hello, this is Ann.\nBob: Hi Ann, Bob here.\nAnn: How are you?\n")
    (d / "mixed.wav").write_bytes(b"")
    (d / "mixed.txt").write_text("one\ntwo\n")
    (d / "mixed.speakers.txt").write_text("Ann: one\nbob\n")
    (d / "lone.wav").write_bytes(b"")
    (d / "lone.speakers.txt").write_text("ann\nbob\n")

    def hyp(path, **hints):
        return engine_result([{"speaker": 1, "start": 0.0, "end": 2.0, "text": "Hello, this is Ann."},
                              {"speaker": 2, "start": 2.0, "end": 3.0, "text": "Hi Ann, Bob here."},
                              {"speaker": 1, "start": 3.0, "end": 4.0, "text": "How are you?"}], 4.0)

    report = evaluate(tmp_path / "data", hyp)
    by = {r["id"]: r for r in report["items"]}
    c = by["call/c.wav"]
    assert c["wer"] == 0 and c["cpwer"] == 0 and c["cp_reference"] == "speakers.txt" and c["ref_speakers"] == 2
    assert report["not_scored"] == [] and report["unmatched_references"] == []
    assert "mixes 1 'speaker: text' lines with 1 bare labels" in by["call/mixed.wav"]["reference_errors"][0]
    assert by["call/mixed.wav"]["wer"] is not None  # the .txt still scores WER
    assert "bare labels but there is no transcript" in by["call/lone.wav"]["error"]


def test_a_copy_whose_reference_is_named_for_another_file_is_reported_as_such(tmp_path):
    """An 8 kHz copy renamed so that no reference's name is a prefix of its own: the reference beside it
    is another file's, which the reason says (it used to say that there was no reference at all)."""
    d = tmp_path / "data" / "timit"
    d.mkdir(parents=True)
    for name in ("LDC93S1.wav", "LDC93S1_8000.wav", "LDC93S1-8k.wav"):
        (d / name).write_bytes(b"")
    (d / "LDC93S1.txt").write_text("she had your dark suit\n")
    report = evaluate(tmp_path / "data", lambda p, **h: engine_result(
        [{"speaker": 0, "start": 0.0, "end": 1.0, "text": "she had your dark suit"}], 2.0))
    assert sorted(r["id"] for r in report["items"]) == ["timit/LDC93S1.wav", "timit/LDC93S1_8000.wav"]
    (n,) = report["not_scored"]
    assert n["id"] == "timit/LDC93S1-8k.wav"
    assert n["reason"].startswith("no reference named after it: the references beside it belong to other audio "
                                  "files: LDC93S1.txt (LDC93S1.wav, LDC93S1_8000.wav)")


def test_totals_pool_as_jiwer_meeteval_and_pyannote_do(tmp_path):
    import jiwer
    from pyannote.core import Annotation, Segment
    from pyannote.metrics.diarization import DiarizationErrorRate, JaccardErrorRate

    from diarist.transcript import Transcript
    from evaluation.references import load_references
    from evaluation.scoring import hypothesis_annotation

    d = tmp_path / "data"
    d.mkdir()
    # a long item scored well and a short one scored badly: pooled and mean differ
    (d / "long.wav").write_bytes(b"")
    (d / "long.stm").write_text("long 1 A 0.0 10.0 " + " ".join(["word"] * 20) + "\n"
                                "long 1 B 10.0 20.0 " + " ".join(["talk"] * 20) + "\n")
    (d / "long.rttm").write_text("SPEAKER long 1 0.0 10.0 <NA> <NA> A <NA> <NA>\n"
                                 "SPEAKER long 1 10.0 10.0 <NA> <NA> B <NA> <NA>\n")
    (d / "short.wav").write_bytes(b"")
    (d / "short.stm").write_text("short 1 A 0.0 2.0 yes no\n")
    (d / "short.rttm").write_text("SPEAKER short 1 0.0 2.0 <NA> <NA> A <NA> <NA>\n")
    hyps = {"long": engine_result([{"speaker": 0, "start": 0.0, "end": 11.0, "text": " ".join(["word"] * 19)},
                                   {"speaker": 1, "start": 11.0, "end": 20.0, "text": " ".join(["talk"] * 20)}],
                                  20.0),
            "short": engine_result([{"speaker": 0, "start": 0.0, "end": 1.0, "text": "yes"},
                                    {"speaker": 1, "start": 1.0, "end": 2.0, "text": "oh no"}], 2.0)}
    report = evaluate(d, lambda p, **h: hyps[Path(p).stem], collars=(0.0,))
    o, items = report["overall"], {r["id"]: r for r in report["items"]}

    refs = {k: load_references(next(i for i in discover(d)[0] if i.audio.stem == k)) for k in hyps}
    ts = {k: Transcript.from_engine(v) for k, v in hyps.items()}
    ref_text = [" ".join(x.text for x in refs[k].speaker_lines) for k in hyps]
    assert o["wer"] == pytest.approx(jiwer.wer(ref_text, [ts[k].text for k in hyps]))  # jiwer over all items
    cp = [items[f"{k}.wav"]["cp_detail"]["words"] for k in hyps]  # meeteval's own per-item error rates
    assert o["cpwer"] == pytest.approx((cp[0]["errors"] + cp[1]["errors"]) / (cp[0]["length"] + cp[1]["length"]))
    der, jer = DiarizationErrorRate(skip_overlap=False), JaccardErrorRate(skip_overlap=False)
    for k in hyps:  # pyannote's own accumulation over the items
        hyp = hypothesis_annotation(ts[k], k)
        uem = Annotation(uri=k)
        uem[Segment(0, ts[k].duration)] = "x"
        der(refs[k].rttm, hyp, uem=uem.get_timeline())
        jer(refs[k].rttm, hyp, uem=uem.get_timeline())
    assert o["der_c0"] == pytest.approx(abs(der)) and o["jer_c0"] == pytest.approx(abs(jer))
    for m in ("wer", "cpwer", "der_c0", "jer_c0"):
        mean = sum(items[f"{k}.wav"][m] for k in hyps) / 2
        assert o[f"{m}_mean"] == pytest.approx(mean) and o[f"{m}_mean"] != pytest.approx(o[m]), m


def test_text_errors_count_the_reference_words_lost():
    from evaluation.scoring import text_errors

    out = text_errors("one two three four", "One... four!")
    # jiwer aligns "one four" to "one two three four": two deletions, nothing substituted or inserted
    assert (out["wer_deletions"], out["wer_errors"], out["ref_words"]) == (2, 2, 4)
    assert text_errors("你好世界", "你好")["wer_deletions"] is None  # characters, no word alignment


# --- the progress display ---------------------------------------------------------------------------------


def _eval_streams(monkeypatch, tty: bool, argv: list[str], transcribe_fn=None) -> tuple[str, str]:
    import io
    import sys

    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    out, err = io.StringIO(), Stream()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    parser = argparse.ArgumentParser(prog="diarist")
    eval_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", *argv])
    assert args.func(args, transcribe_fn=transcribe_fn) == 0
    monkeypatch.undo()
    return out.getvalue(), re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err.getvalue())


def test_cli_progress_shows_items_and_running_figures_on_a_terminal_only(synthetic, monkeypatch, tmp_path):
    saved = str(tmp_path / "hyps")
    _eval_streams(monkeypatch, False, [str(synthetic), "--save-hyp", saved], perturbed)
    # replayed results: the same figures every run (a measured RTF would differ between the runs compared)
    replay = [str(synthetic), "--hyp-dir", saved]
    out_tty, err_tty = _eval_streams(monkeypatch, True, replay)
    out_pipe, err_pipe = _eval_streams(monkeypatch, False, replay)
    out_quiet, err_quiet = _eval_streams(monkeypatch, True, [*replay, "--quiet"])
    assert out_tty == out_pipe == out_quiet and "overall:" in out_pipe  # the table is the same every time
    assert "2/2 items" in err_tty and re.search(r"so far: WER \d+\.\d% cpWER \d+\.\d% DER\(c0\.25\) \d+\.\d%", err_tty)
    assert "  meet/m.wav: rtf" in err_tty and "  meet/m.wav: rtf" in err_pipe  # the item lines, either way
    assert "items" not in err_pipe and "WER" not in err_pipe  # no progress line off a terminal
    assert err_quiet == ""


def test_running_figures_are_the_pooled_ones_so_far():
    overall = {"wer": 0.125, "cpwer": None, "der_c0.25": 0.05, "rtf": 0.2}
    assert eval_cmd.running_figures(overall, (0.0, 0.25)) == "WER 12.5% cpWER - DER(c0.25) 5.0% RTF 0.200"
