"""The portable CPU mode (determinism.cpu_isa, reprotune._determinism.isa): every kernel knob pinned
to a named baseline before torch loads, read back, refused where it cannot be in force; a run in it
is IDENTICAL to one on a machine whose dispatch is capped to that baseline from the outside.

The modes tried are those this CPU can hold: ``avx2-compatible`` (MKL's vendor-neutral branch) on
every AVX2 CPU, ``avx2`` (MKL's Intel-only AVX2 branch) on Intel CPUs and ``avx2-amd`` (MKL's own AMD
path) on AMD CPUs; each vendor's mode is shown refused on the other."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reprotune._determinism import isa
from reprotune._determinism.cpu import cpu_vendor
from reprotune._errors import InputError
from reprotune._proof.compare import compare_runs
from tinyrun import TinyProject

#: A lesser machine, made from the outside: every dispatch knob capped to AVX2.
CAPPED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
INTEL, AMD = cpu_vendor() == isa.INTEL, cpu_vendor() == isa.AMD
#: The portable modes this CPU can hold, each with the CNR mode MKL must report in it.
MODES = {
    "avx2-compatible": "COMPATIBLE,STRICT",
    **({"avx2": "AVX2,STRICT"} if INTEL else {}),
    **({"avx2-amd": "AUTO,STRICT"} if AMD else {}),
}


def test_an_environment_that_contradicts_the_mode_is_refused() -> None:
    """A variable already set to another value is named, never overridden silently; a CPU without
    the baseline's instructions is refused, naming what it lacks."""
    with pytest.raises(InputError, match="already holds MKL_CBWR=AVX2"):
        isa.set_isa_environment("avx2-compatible", {"MKL_CBWR": "AVX2"})
    with pytest.raises(InputError, match=r"unknown determinism\.cpu_isa 'sse9'"):
        isa.set_isa_environment("sse9", {})
    assert isa.set_isa_environment("native", {}) is False


def test_a_cpu_without_the_baseline_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset({"sse4_2", "avx"}))
    with pytest.raises(InputError, match="it lacks avx2, fma, f16c"):
        isa.set_isa_environment("avx2", {})


def test_an_intel_only_branch_is_refused_on_another_vendor(monkeypatch: pytest.MonkeyPatch) -> None:
    """MKL reads its AVX2 and AVX512 branches on Intel CPUs only: on an AMD CPU those modes are
    refused before torch loads, pointing at the vendor-neutral mode, which is accepted."""
    monkeypatch.setattr(isa, "cpu_vendor", lambda: "AuthenticAMD")
    every_flag = frozenset(flag for baseline in isa.BASELINES.values() for flag in baseline.needs)
    monkeypatch.setattr(isa, "cpu_flags", lambda: every_flag)  # an AMD CPU with all of them
    for mode in ("avx2", "avx512"):
        with pytest.raises(InputError, match="cannot be put in force on this AuthenticAMD CPU") as info:
            isa.set_isa_environment(mode, {})
        assert "avx2-amd (the same bits on AMD CPUs with AVX2)" in (info.value.fix or "")
        assert "avx2-compatible" in (info.value.fix or "")
    monkeypatch.delitem(
        sys.modules, "torch", raising=False
    )  # as if torch were not loaded yet (restored after)
    for mode, cbwr in (("avx2-compatible", "COMPATIBLE,STRICT"), ("avx2-amd", "AUTO,STRICT")):
        environ: dict[str, str] = {}
        assert isa.set_isa_environment(mode, environ) is True
        assert environ["MKL_CBWR"] == cbwr and environ["ATEN_CPU_CAPABILITY"] == "avx2"


def test_the_amd_baseline_is_refused_on_an_intel_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``avx2-amd`` pins MKL's own AMD code path (``AUTO``): on an Intel CPU MKL would pick an Intel
    branch under the same settings, so the mode is refused there, pointing at ``avx2``."""
    monkeypatch.setattr(isa, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma", "f16c"}))
    with pytest.raises(InputError, match="cannot be put in force on this GenuineIntel CPU") as info:
        isa.set_isa_environment("avx2-amd", {})
    assert "MKL's own AMD code path" in info.value.message
    assert "avx2 (the same bits on Intel CPUs with AVX2)" in (info.value.fix or "")


@pytest.mark.parametrize("in_force", [5, None, ["avx2-amd"]], ids=["number", "null", "list"])
def test_a_damaged_mode_in_force_falls_back_to_the_config_s(in_force: object) -> None:
    """The mode a command pins before torch loads is the record's: a kernel fact that is no text
    (a damaged record) took the config's mode for none at all, and the command then refused,
    telling the user to run it through the CLI they had run it through."""
    from reprotune._cli._options import _mode_in_record

    record = {
        "environment": {"kernels": {"portable": {"cpu_isa": in_force}}},
        "config": {"determinism": {"cpu_isa": "avx2-compatible"}},
    }
    assert _mode_in_record(record) == "avx2-compatible"


def test_a_mode_not_in_force_in_this_process_is_refused() -> None:
    """torch is loaded here with this CPU's own kernels: a baseline cannot be claimed now, and the
    refusal names each knob that differs and how to set it before Python starts."""
    with pytest.raises(InputError) as info:
        isa.require_isa("avx2-compatible")
    assert "is not in force in this process" in info.value.message
    assert "MKL_CBWR=COMPATIBLE,STRICT" in (info.value.fix or "")
    assert isa.require_isa("native")["cpu_isa"] == "native"


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    """Runs of one config: native, and each mode of :data:`MODES` here and on a machine capped
    to AVX2."""
    project = TinyProject.create(tmp_path_factory.mktemp("portable"))
    config = str(project.config("cfg.yaml"))
    project.run_cli("run", config, "--run-dir", "native", "--no-progress")
    for mode in MODES:
        pinned = ("--set", f"determinism.cpu_isa={mode}")
        project.run_cli("run", config, "--run-dir", mode, "--no-progress", *pinned)
        project.run_cli("run", config, "--run-dir", f"{mode}-capped", "--no-progress", *pinned, env=CAPPED)
    return project


@pytest.mark.parametrize("mode", list(MODES))
def test_portable_runs_are_identical_on_a_capped_machine(portable: TinyProject, mode: str) -> None:
    """A portable mode here and on a machine capped to AVX2 from the outside: IDENTICAL, and each
    record says the mode was in force (read back from ATen and MKL)."""
    result = compare_runs(portable.root / mode, portable.root / f"{mode}-capped")
    assert result.verdict.value == "IDENTICAL", result.format()
    for name in (mode, f"{mode}-capped"):
        kernels = json.loads((portable.root / name / "record.json").read_text())["environment"]["kernels"]
        assert kernels["portable"] == {"cpu_isa": mode} and kernels["cpu"]["aten_capability"] == "AVX2"
        if kernels["blas"]["blas"] == "mkl":
            assert kernels["blas"]["mkl_cbwr"] == MODES[mode]


@pytest.mark.parametrize("mode", list(MODES))
def test_portable_differs_from_native_where_the_kernels_differ(portable: TinyProject, mode: str) -> None:
    """native against a portable mode: the records' kernel facts differ (MKL's CNR mode at least);
    where the kernels differ (another ATen capability, or MKL's compatible branch) the numbers
    differ too, and compare says why."""
    native = json.loads((portable.root / "native" / "record.json").read_text())["environment"]["kernels"]
    result = compare_runs(portable.root / "native", portable.root / mode)
    assert any(d.category == "kernels" for d in result.differences)
    mkl = native["blas"]["blas"] == "mkl"
    if native["cpu"]["aten_capability"] != "AVX2" or (mode == "avx2-compatible" and mkl):
        assert result.verdict.value == "DIVERGED"
        # the config's mode is told as the kernels it chose, first, so the trace commands follow
        assert "CPU kernels differ" in result.causes[0]
        assert f"determinism.cpu_isa native vs {mode}" in result.causes[0]
        assert not any(
            cause.endswith(f"config.determinism.cpu_isa native vs {mode}") for cause in result.causes
        )
        assert any("reprotune trace" in line for line in result.next_steps)


def test_doctor_says_which_mode_is_in_force(portable: TinyProject) -> None:
    mode = next(iter(MODES))
    done = portable.run_cli(
        "doctor", "cfg.yaml", "--set", f"determinism.cpu_isa={mode}", "--no-probe", check=False
    )
    assert f"cpu-kernels-portable: determinism.cpu_isa '{mode}' is in force" in done.stdout
    done = portable.run_cli("doctor", "cfg.yaml", "--no-probe", check=False)
    assert "cpu-kernels-native" in done.stdout
    own = isa.vendor_baseline(cpu_vendor())  # this CPU's vendor's own mode is named first
    if own is not None:
        assert f"with AVX2 pin determinism.cpu_isa: {own}; across vendors too, avx2-compatible" in done.stdout


def test_a_mode_that_cannot_be_put_in_force_is_refused_before_anything_is_written(
    portable: TinyProject, tmp_path: Path
) -> None:
    """A machine whose ATen is capped below the baseline: exit 2, the variable named, no run."""
    done = portable.run_cli(
        "run",
        "cfg.yaml",
        "--run-dir",
        str(tmp_path / "refused"),
        "--set",
        "determinism.cpu_isa=avx2-compatible",
        env={"ATEN_CPU_CAPABILITY": "default"},
        check=False,
    )
    assert done.returncode == 2
    assert "already holds ATEN_CPU_CAPABILITY=default" in done.stderr
    assert not (tmp_path / "refused").exists()
    mode = next(iter(MODES))  # a replay of a portable run under a contradicting variable
    done = portable.run_cli(
        "trace",
        mode,
        "--step",
        "1",
        "--out",
        str(tmp_path / "t.jsonl"),
        env={"ATEN_CPU_CAPABILITY": "default"},
        check=False,
    )
    assert done.returncode == 2 and not (tmp_path / "t.jsonl").exists()
    assert (
        f"the run in {mode} was made in determinism.cpu_isa {mode!r} (its record says), which this command "
        "replays" in done.stderr
    )
    assert "fix: unset the variables named (the mode sets them itself)" in done.stderr
    assert "use determinism.cpu_isa: native" not in done.stderr


def test_a_bundle_of_a_portable_run_reruns_in_its_mode(portable: TinyProject, tmp_path: Path) -> None:
    """`rerun BUNDLE` reads the mode from the record inside the archive and sets it before torch
    loads: the bundle of a portable run reruns IDENTICAL in a fresh interpreter."""
    mode = next(iter(MODES))
    bundle = tmp_path / "portable.tar.gz"
    portable.run_cli("pack", mode, "-o", str(bundle), "--with-data")
    done = portable.run_cli(
        "rerun", str(bundle), "--out", str(tmp_path / "rerun"), "--no-progress", cold=True
    )
    assert "IDENTICAL" in done.stdout
    kernels = json.loads((tmp_path / "rerun" / "rerun" / "record.json").read_text())["environment"]["kernels"]
    assert kernels["portable"] == {"cpu_isa": mode}


def test_a_run_made_in_the_amd_mode_is_refused_on_intel_saying_where_it_replays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`trace`/`rerun` of a run made in avx2-amd on an Intel CPU: refused (exit 2 from the CLI)
    naming the recorded mode and the vendor, and saying which CPU can replay it."""
    from reprotune._cli._options import _pin_recorded

    monkeypatch.setattr(isa, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma", "f16c"}))
    with pytest.raises(InputError) as info:
        _pin_recorded("avx2-amd", "the run in runs/r")
    assert info.value.message.startswith("the run in runs/r was made in determinism.cpu_isa 'avx2-amd'")
    assert "cannot be put in force on this GenuineIntel CPU" in info.value.message
    assert "avx2-amd an AMD one" in (info.value.fix or "")


def test_the_amd_modes_knobs_on_an_intel_cpu_are_read_back_as_native(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every knob of avx2-amd in force (ATen AVX2, MKL AUTO,STRICT) names the mode on an AMD CPU;
    the same knobs on an Intel CPU are not the mode (MKL's AUTO picks an Intel branch there)."""
    import torch

    environ = dict(isa.BASELINES["avx2-amd"].env)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(isa, "mkl_cbwr", lambda: "AUTO,STRICT")
    monkeypatch.setattr(isa, "cpu_vendor", lambda: "AuthenticAMD")
    assert isa.isa_in_force(environ)["cpu_isa"] == "avx2-amd"
    monkeypatch.setattr(isa, "cpu_vendor", lambda: "GenuineIntel")
    assert isa.isa_in_force(environ)["cpu_isa"] == "native"


def test_the_mode_a_run_is_replayed_in_is_the_one_its_record_says_was_in_force(tmp_path: Path) -> None:
    """``trace``, ``eval``, ``rerun`` and ``resume`` pin the mode the record's kernel facts say was
    in force (read back when the run started): a Trainer script's run, put in a mode by its
    variables, has no config key; a config's own key is the fallback for records before the
    kernel facts, and a Trainer run recorded before them pins nothing."""
    from reprotune._cli._options import recorded_cpu_isa

    def run(name: str, record: dict[str, object]) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(json.dumps(record))
        return tmp_path / name

    kernels = {"kernels": {"portable": {"cpu_isa": "avx2-compatible"}}}
    assert (
        recorded_cpu_isa(run("trainer", {"config": {"trainer": {}}, "environment": kernels}))
        == "avx2-compatible"
    )
    by_hand = {"config": {"determinism": {"cpu_isa": "native"}}, "environment": kernels}
    assert recorded_cpu_isa(run("by-hand", by_hand)) == "avx2-compatible"
    assert recorded_cpu_isa(run("old", {"config": {"determinism": {"cpu_isa": "avx2-amd"}}})) == "avx2-amd"
    assert recorded_cpu_isa(run("older", {"config": {"determinism": {}}, "environment": None})) == "native"
    assert recorded_cpu_isa(run("old-trainer", {"config": {"trainer": {}}, "environment": {}})) is None
    assert recorded_cpu_isa(tmp_path / "no-run") is None


def test_doctors_advice_names_only_modes_this_cpu_can_hold() -> None:
    """An Arm CPU gets no x86 mode to pin (each would be refused there); an x86 CPU of an unknown
    vendor gets every mode, under its full key."""
    from reprotune._doctor.kernel_checks import _portable_fix

    assert "no portable mode pins an Arm CPU's kernels" in _portable_fix("0x41", arm=True)
    unknown = _portable_fix(None)
    assert "determinism.cpu_isa: avx2 (Intel), avx2-amd (AMD) or avx2-compatible" in unknown


def test_spaces_beside_a_comma_are_the_value_mkl_reads() -> None:
    """MKL reads ``MKL_CBWR="COMPATIBLE, STRICT"`` as COMPATIBLE,STRICT: the mode takes it as its
    own value, not a clash (before: refused as one, and a Trainer script started with it recorded
    native); another value is still a clash."""
    env = {"MKL_CBWR": "COMPATIBLE, STRICT"}
    isa.set_isa_environment("avx2-compatible", env)  # torch is loaded here: checked, not set
    with pytest.raises(InputError, match="already holds MKL_CBWR=AUTO, STRICT"):
        isa.set_isa_environment("avx2-compatible", {"MKL_CBWR": "AUTO, STRICT"})
