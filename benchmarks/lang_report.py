"""Per-language comparison of two `diarist eval` reports (e.g. tiny.en and base), with per-clip CER of the
Chinese and Japanese items.

Usage (the reports and hypothesis folders come from ``diarist eval DATA --out R.json --save-hyp DIR``)::

    python benchmarks/lang_report.py --report tiny.en=tiny.json:tiny_hyp --report base=base.json:base_hyp \\
        --out benchmarks/results/languages_cpu.json

CER here is the eval scorer's (``evaluation.scoring.text_errors``: NFKC, lowercase, punctuation -> space, then
for zh/ja every space removed and each character a token). Whisper writes Mandarin in either script (base
often answers in Traditional characters for Simplified references), so zh clips also get
``cer_t2s``: the same score after OpenCC's ``t2s`` conversion of the hypothesis (the references are
Simplified), which counts a script variant of the right character as correct. Prints JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import subprocess
import sys
from pathlib import Path


def _text(hyp_dir: Path, item_id: str) -> str:
    from diarist.transcript import Transcript

    raw = json.loads((hyp_dir / (item_id.replace("/", "__") + ".json")).read_text())
    return Transcript.from_engine_json(raw).text


def _clip(rec: dict, hyp_dir: Path, data_dir: Path) -> dict:
    from evaluation.scoring import text_errors

    hyp = _text(hyp_dir, rec["id"])
    ref = (data_dir / rec["references"]["txt"]).read_text(encoding="utf-8") if "txt" in rec["references"] else ""
    out = {"id": rec["id"], "language": rec.get("language"), "language_source": rec.get("language_source"),
           "cer": rec.get("cer"), "hypothesis": hyp, "reference": ref.strip(), "rtf": rec.get("rtf")}
    if rec["ref_language"] == "zh" and ref.strip():
        import opencc

        out["cer_t2s"] = text_errors(ref, opencc.OpenCC("t2s").convert(hyp))["cer"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", action="append", required=True, metavar="NAME=REPORT.json:HYP_DIR")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    models = {}
    for spec in a.report:
        name, rest = spec.split("=", 1)
        report_path, hyp_dir = rest.rsplit(":", 1)
        rep = json.loads(Path(report_path).read_text())
        data_dir = Path(rep["data_dir"])
        per_lang = {lang: {k: agg.get(k) for k in ("items", "wer", "cer", "der_c0.25", "audio_s", "processing_s",
                                                     "rtf")}
                    for lang, agg in rep["by_language"].items()}
        clips = [_clip(r, Path(hyp_dir), data_dir) for r in rep["items"]
                 if r.get("ref_language") in ("zh", "ja") and "error" not in r]
        zh = [c for c in clips if "cer_t2s" in c]
        models[name] = {"eval_command": rep["command"], "eval_git_commit": rep["git_commit"],
                        "eval_created_at": rep["created_at"], "model_path": rep.get("model_path"),
                        "overall": {k: rep["overall"].get(k) for k in ("items", "wer", "cer", "cpwer", "der_c0.25",
                                                                       "rtf")},
                        "by_language": per_lang, "cjk_clips": clips,
                        "zh_cer_t2s_mean": sum(c["cer_t2s"] for c in zh) / len(zh) if zh else None}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    out = {"command": " ".join(shlex.quote(x) for x in sys.argv), "git_commit": commit,
           "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "models": models}
    text = json.dumps(out, indent=2, ensure_ascii=False)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
