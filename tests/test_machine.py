"""embtrain.machine: the CPU's model, vector ISA and half-precision features from /proc/cpuinfo,
and the one line validate and plan print for mixed precision on a CPU without native bfloat16."""

from __future__ import annotations

from pathlib import Path

import pytest

from embtrain.machine import Cpu, half_precision_note, parse_cpuinfo, this_cpu

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse avx2
"""
XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: sse4_2 avx fma avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile
"""


def test_cpuinfo_gives_the_model_the_vector_isa_and_half_features() -> None:
    epyc, xeon = parse_cpuinfo(EPYC), parse_cpuinfo(XEON)
    assert epyc.model == "AMD EPYC 7B13" and epyc.vector_isa == "AVX2"
    assert not epyc.native_bfloat16 and epyc.half_features == []
    assert epyc.summary() == "AMD EPYC 7B13, AVX2, no native bfloat16"
    assert xeon.vector_isa == "AVX-512" and xeon.native_bfloat16
    assert xeon.half_features == ["AMX-BF16", "AVX512-BF16", "AVX512-FP16"]
    assert xeon.summary() == "Intel(R) Xeon(R) Processor, AVX-512, AMX-BF16 + AVX512-BF16 + AVX512-FP16"
    assert Cpu("x", frozenset({"sse4_2"})).vector_isa == "SSE4.2"
    assert Cpu("x", frozenset()).vector_isa == "unknown"


def test_mixed_precision_note_only_where_the_cpu_has_no_native_bfloat16() -> None:
    epyc, xeon = parse_cpuinfo(EPYC), parse_cpuinfo(XEON)
    for precision in ("bf16", "fp16"):
        note = half_precision_note(precision, epyc)
        assert note is not None and "\n" not in note
        assert note.startswith(f"train.mixed_precision: {precision}: ")
        assert "AMD EPYC 7B13" in note and "AVX2" in note and "float32" in note
        assert half_precision_note(precision, xeon) is None
    assert half_precision_note("none", epyc) is None


def test_this_machine_is_read() -> None:
    cpu = this_cpu()
    assert cpu.model and cpu.vector_isa


def test_validate_and_plan_say_what_mixed_precision_does_on_this_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process (the CPU is swapped for an AVX2 EPYC's cpuinfo): the note on a CPU without
    native bfloat16, and none with native bfloat16 or in float32; plan names the CPU."""
    from typer.testing import CliRunner

    import embtrain.machine as machine
    from embtrain.cli.main import app

    text = (Path(__file__).parents[1] / "recipes" / "quickstart.yaml").read_text()
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(text.replace("\ntrain:", "\ntrain:\n  mixed_precision: bf16", 1))
    runner = CliRunner()
    for cpuinfo, expect_note in ((EPYC, True), (XEON, False)):
        monkeypatch.setattr(machine, "this_cpu", lambda info=cpuinfo: parse_cpuinfo(info))
        for command in (["validate", str(mixed)], ["plan", str(mixed)]):
            out = runner.invoke(app, command)
            assert out.exit_code == 0, out.output
            notes = [line for line in out.output.splitlines() if line.startswith("note:")]
            assert len(notes) == (1 if expect_note else 0), out.output
            if expect_note:
                assert "no native bfloat16" in notes[0] and "AMD EPYC 7B13" in notes[0]
        plan = runner.invoke(app, ["plan", str(mixed)]).output
        assert f"cpu: {parse_cpuinfo(cpuinfo).summary()}" in plan
    plain = runner.invoke(app, ["validate", str(tmp_path / "plain.yaml")])
    assert plain.exit_code != 0  # a missing file is not ok
    (tmp_path / "plain.yaml").write_text(text)
    monkeypatch.setattr(machine, "this_cpu", lambda: parse_cpuinfo(EPYC))
    out = runner.invoke(app, ["validate", str(tmp_path / "plain.yaml")])
    assert out.exit_code == 0 and "note:" not in out.output
