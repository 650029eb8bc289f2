"""benchmarks/eval_targets.py: the issue 21 item 12 verdicts on a made-up eval report."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "eval_targets", Path(__file__).resolve().parents[1] / "benchmarks" / "eval_targets.py")
eval_targets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_targets)


def _ami(name, der, missed, total, **kw):
    return {"id": f"en_ami_{name}/x.wav", "ref_language": "en", "der_c0.25": der,
            "der_c0.25_detail": {"missed": missed, "false_alarm": 0.0, "confusion": der * total - missed,
                                 "total": total}, **kw}


def test_verdicts_follow_the_numbers():
    report = {"items": [
        _ami("a", 0.30, 1.0, 10.0), _ami("b", 0.20, 0.0, 30.0),
        {"id": "en_ami_headset/h.wav", "ref_language": "en", "ref_words": 10, "wer_deletions": 3, "hyp_words": 7},
        {"id": "en_2spk_phonecall/p.wav", "ref_language": "en", "der_c0.25": 0.05, "cpwer": 0.3},
        {"id": "zh_x/z.wav", "ref_language": "zh", "language": "zh", "cer": 0.2},
        {"id": "ja_x/j.wav", "ref_language": "ja", "language": "en", "cer": 1.0},
    ]}
    v = eval_targets.check(report, multilingual=True)
    assert v["ami_max_words_lost"]["value"] == pytest.approx(0.3) and v["ami_max_words_lost"]["met"] is False
    assert v["ami_mean_der_c0.25"]["value"] == pytest.approx(0.25) and v["ami_mean_der_c0.25"]["met"] is True
    # pooled: (3 + 6) s of error over 40 s of reference
    assert v["ami_mean_der_c0.25"]["pooled"] == pytest.approx(9 / 40)
    assert (v["phone_der_c0.25"]["met"], v["phone_cpwer"]["met"]) == (True, False)
    assert (v["cjk_in_their_language"]["value"], v["cjk_in_their_language"]["met"]) == (1, False)
    assert eval_targets.check(report, multilingual=False)["cjk_in_their_language"]["met"] is None
    assert "| AMI mean DER" in eval_targets.markdown(
        {"command": "c", "git_commit": "abcdef0", "reports": {"m": {"model": "m", "git_commit": "1234567",
                                                                     "verdicts": v}}})
