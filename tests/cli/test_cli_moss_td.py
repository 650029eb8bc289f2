"""`diarist transcribe --model moss-td --load-format dummy` runs the MOSS-TD path end to end (random text)."""

from __future__ import annotations

import json

from cli.main import main
from tests.conftest import data_file


def test_moss_td_dummy_end_to_end(capsys):
    status = main(["transcribe", str(data_file("en_jfk_inaugural/jfk.flac")), "--model", "moss-td",
                   "--load-format", "dummy", "--dummy-config", "tiny", "--max-new-tokens", "12", "--format", "json"])
    out = capsys.readouterr()
    assert status == 0, out.err
    t = json.loads(out.out)
    assert t["duration"] == 11.0 and t["model"] == "moss-td-dummy"
    # Random weights rarely stop on their own: the 12-token budget ends it, and that is never a silent success.
    assert t["finish_reason"] in ("length", "stop", "repetition")
    if t["finish_reason"] != "stop":
        assert t["incomplete"] is True and t["incomplete_reason"]


def test_moss_td_bad_dummy_config_is_a_clear_error(capsys):
    status = main(["transcribe", str(data_file("en_jfk_inaugural/jfk.flac")), "--model", "moss-td",
                   "--load-format", "dummy", "--dummy-config", "{not json"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("diarist: error: bad_option:") and err.count("\n") == 1
