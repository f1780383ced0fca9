import os
from pathlib import Path

from runner.cli.bundle import ONE_FILE_MAX_MODEL_BYTES, compiled_features, missing_features
from runner.cli.main import main
from tiny_gguf import write_tiny_gguf

INFO = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 0 | LLAMAFILE = 1 |"
OLD_CPU = "processor: 0\nflags\t\t: fpu sse sse2 pni ssse3 sse4_1 sse4_2 popcnt avx\n"
NEW_CPU = "flags\t\t: fpu sse2 pni ssse3 avx avx2 f16c fma bmi2 avx512f\n"


def test_compiled_features_keep_only_enabled_cpu_features() -> None:
    assert compiled_features(INFO) == ["SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2"]


def test_an_older_cpu_is_told_what_it_lacks() -> None:
    required = compiled_features(INFO)
    assert missing_features(required, OLD_CPU) == ["AVX2", "F16C", "FMA", "BMI2"]
    assert missing_features(required, NEW_CPU) == []


def test_an_avx512_build_runs_on_the_avx512_cpu_it_was_built_on() -> None:
    """The system info and the cpuinfo flags of the same machine (this one, 2026-12-02): cpuinfo
    spells VBMI without the underscore VNNI and BF16 have."""
    info = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
            "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 |")
    cpuinfo = ("flags\t\t: fpu sse2 pni ssse3 fma avx f16c avx2 bmi2 avx512f avx512dq avx512ifma avx512cd avx512bw "
               "avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq\n")
    required = compiled_features(info)
    assert "AVX512_VBMI" in required
    assert missing_features(required, cpuinfo) == []
    assert missing_features(required, cpuinfo.replace(" avx512vbmi", "")) == ["AVX512_VBMI"]


def test_a_model_too_big_for_one_file_is_refused_before_pyinstaller_runs(tmp_path: Path, capsys) -> None:
    """The executable's archive stays under 4 GiB: a larger model gets one readable line, at once,
    not PyInstaller's struct.error after a minute of analysis."""
    model = write_tiny_gguf(tmp_path / "big.gguf")
    os.truncate(model, ONE_FILE_MAX_MODEL_BYTES + 1)  # (sparse: no disk used)
    assert main(["bundle", str(model), "-o", str(tmp_path / "out" / "big")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["runner: error: big.gguf is 3.8 GiB: a one-file executable holds 3.75 GiB of model at most "
                   "(PyInstaller's archive stays under 4 GiB in all); bundle a smaller quant, or serve this one "
                   "with `runner serve`"]
    assert not (tmp_path / "out").exists()


def test_one_part_of_a_split_model_is_refused(tmp_path: Path, capsys) -> None:
    write_tiny_gguf(tmp_path / "split.gguf", split_max_tensors=4)
    first = sorted(tmp_path.glob("split-00001-of-*.gguf"))[0]
    assert main(["bundle", str(first), "-o", str(tmp_path / "out" / "split")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is one part of a split GGUF; a bundle carries one file" in err[0]
    assert not (tmp_path / "out").exists()


def test_an_output_that_is_a_directory_or_cannot_be_written_is_refused_before_pyinstaller_runs(
        tmp_path: Path, capsys) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "a-file").write_text("in the way")
    assert main(["bundle", str(model), "-o", str(tmp_path)]) == 1  # (PyInstaller would write into it, or over it)
    assert capsys.readouterr().err.startswith(f"runner: error: -o {tmp_path} is a directory: name the executable")
    assert main(["bundle", str(model), "-o", str(tmp_path / "a-file" / "chat")]) == 1
    assert capsys.readouterr().err.startswith(f"runner: error: cannot write {tmp_path / 'a-file' / 'chat'}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "tiny.gguf"]
