"""``compare`` weighs only the kernel facts that could have chosen a run's kernels: a GPU a CPU run
did not use, how many GPUs a machine has and their UUIDs are listed, never a cause; a section an
older record lacks is unknown; a run's settings (CUDA math modes, attention, thread variables) are
settings, not two machines; every kernel fact has a name; one fact is one cause."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprotune._proof.causes import is_traceable_cause
from reprotune._proof.compare import compare_runs
from reprotune._run.kernel_compare import comparable, kernel_differences
from rundirs import RunSpec, write_run_dir

NOTHING = "yet nothing recorded differs"
H100 = {"name": "NVIDIA H100", "capability": "9.0", "sm_count": 132}


def _kernels(**changes: Any) -> dict[str, Any]:
    """A whole, current ``environment.kernels`` of an Intel machine, ``changes`` merged per section."""
    facts: dict[str, Any] = {
        "version": 1,
        "cpu": {
            "arch": "x86_64",
            "vendor": "GenuineIntel",
            "model": "Intel(R) Xeon(R) Processor",
            "family": "6",
            "model_number": "143",
            "isa": ["avx2", "avx512f"],
            "aten_capability": "AVX512",
        },
        "blas": {"blas": "mkl", "lapack": "mkl", "mkl_code_path": "AVX512_E1", "openmp": "201511"},
        "steering_env": {"OMP_NUM_THREADS": None, "MKL_CBWR": None, "CUBLAS_WORKSPACE_CONFIG": None},
        "attention": {"implementation": "sdpa", "sdpa_math": True},
        "cuda": None,
        "portable": {"cpu_isa": "native"},
        "algorithms": {"deterministic_algorithms": True, "cudnn_benchmark": False},
    }
    for section, values in changes.items():
        facts[section] = (
            {**facts[section], **values} if isinstance(values, dict) and facts[section] else values
        )
    return facts


def _gpu(*devices: dict[str, Any], **math: Any) -> dict[str, Any]:
    listed = [{"index": i, **d} for i, d in enumerate(devices)]
    return {"devices": listed, "cublas": 120900, "math": {"matmul_allow_tf32": False, **math}}


def _pair(
    tmp_path: Path, a: dict[str, Any], b: dict[str, Any], *, device: str | None = None, **extra_b: Any
) -> tuple[Path, Path]:
    config = {"determinism": {"device": device}} if device else {}
    one = write_run_dir(tmp_path / "a", RunSpec(config=config, environment={"kernels": a}))
    env_b = {"kernels": b, **extra_b}
    two = write_run_dir(tmp_path / "b", RunSpec(config=config, noise_from_step=1, environment=env_b))
    return one, two


def test_a_section_an_older_record_lacks_is_unknown_not_a_cause(tmp_path: Path) -> None:
    """B was recorded before ``algorithms`` was: nothing else differs, so nothing recorded does
    (before, "algorithms ... (absent) vs false" was the cause, and no trace commands followed)."""
    older = _kernels()
    del older["algorithms"]
    result = compare_runs(*_pair(tmp_path, _kernels(), older))
    assert NOTHING in result.causes[0] and is_traceable_cause(result.causes[0]), result.causes
    assert not any("algorithms" in d.key for d in result.differences)


def test_precision_settings_an_older_record_lacks_are_unknown_not_a_cause(tmp_path: Path) -> None:
    """B was recorded before reprotune read torch's fp32_precision settings: unknown, so nothing
    recorded differs; the same settings at other values are a difference."""
    flags = {"deterministic_algorithms": True, "float32_matmul_precision": "highest"}
    new = {"fp32_precision": "ieee", "fp32_precision_mkldnn_matmul": "ieee", "fp32_precision_mixed": []}
    one = write_run_dir(
        tmp_path / "a", RunSpec(environment={"kernels": _kernels(), "determinism": {**flags, **new}})
    )
    older = write_run_dir(
        tmp_path / "b", RunSpec(noise_from_step=1, environment={"kernels": _kernels(), "determinism": flags})
    )
    result = compare_runs(one, older)
    assert NOTHING in result.causes[0], result.causes
    assert not any("fp32_precision" in d.key for d in result.differences)
    bf16 = {**flags, **new, "fp32_precision_mkldnn_matmul": "bf16"}
    other = write_run_dir(
        tmp_path / "c", RunSpec(noise_from_step=1, environment={"kernels": _kernels(), "determinism": bf16})
    )
    keys = [d.key for d in compare_runs(one, other).differences]
    assert "environment.determinism.fp32_precision_mkldnn_matmul" in keys, keys


def test_a_gpu_a_cpu_run_did_not_use_is_no_cause(tmp_path: Path) -> None:
    """Both runs computed on the CPU (determinism.device cpu); A's machine has an H100. With the
    CPUs alike nothing recorded differs; with B's CPU narrower, the cause is the CPU's, advising
    the CPU mode, not GPU advice (before: "GPU kernels differ: ... GPU NVIDIA H100 ... vs none")."""
    gpu_machine = {"torch": {"cuda_available": True}, "gpu_driver": "550.54"}
    one = write_run_dir(
        tmp_path / "a",
        RunSpec(
            config={"determinism": {"device": "cpu"}},
            environment={"kernels": _kernels(cuda=_gpu(H100)), **gpu_machine},
        ),
    )
    same = write_run_dir(
        tmp_path / "b",
        RunSpec(
            config={"determinism": {"device": "cpu"}}, noise_from_step=1, environment={"kernels": _kernels()}
        ),
    )
    result = compare_runs(one, same)
    assert NOTHING in result.causes[0], result.causes
    listed = {d.key: d.inert for d in result.differences if "cuda" in d.key or "gpu" in d.key}
    assert listed and all(listed.values()), listed  # listed under what differs, never a cause
    narrow = _kernels(cpu={"aten_capability": "AVX2"}, blas={"mkl_code_path": "AVX2"})
    narrower = write_run_dir(
        tmp_path / "c",
        RunSpec(
            config={"determinism": {"device": "cpu"}}, noise_from_step=1, environment={"kernels": narrow}
        ),
    )
    cause = compare_runs(one, narrower).causes[0]
    assert "CPU kernels differ: CPU capability AVX512 vs AVX2; MKL code path AVX512_E1 vs AVX2:" in cause
    assert "GPU" not in cause and "determinism.cpu_isa: avx2 on both" in cause, cause


def test_how_many_gpus_a_machine_has_and_their_uuids_are_no_cause(tmp_path: Path) -> None:
    """Runs on one H100 each, the machines holding one and eight of them, their UUIDs their own:
    nothing recorded differs (before: "GPU kernels differ: GPU NVIDIA H100 9.0 132 vs NVIDIA H100
    9.0 132; NVIDIA H100 ...")."""
    smi = [{"name": "NVIDIA H100", "driver_version": "550.54", "uuid": "GPU-1111"}]
    eight = [{**smi[0], "uuid": f"GPU-{i}"} for i in range(8)]
    one, two = _pair(
        tmp_path,
        _kernels(cuda=_gpu(H100)),
        _kernels(cuda=_gpu(*[H100] * 8)),
        device="cuda",
        nvidia_smi_gpus=eight,
    )
    result = compare_runs(one, two)
    assert NOTHING in result.causes[0], result.causes
    other = write_run_dir(
        tmp_path / "c",
        RunSpec(
            config={"determinism": {"device": "cuda"}},
            noise_from_step=1,
            environment={
                "kernels": _kernels(cuda=_gpu({**H100, "name": "NVIDIA H200"})),
                "nvidia_smi_gpus": smi,
            },
        ),
    )
    assert (
        compare_runs(one, other)
        .causes[0]
        .startswith(
            "numbers differ from step 1 with identical data order: GPU kernels differ: "
            "GPU NVIDIA H100 9.0 132 vs NVIDIA H200 9.0 132"
        )
    )


def test_a_runs_settings_are_kernel_settings_with_the_knob_that_sets_them(tmp_path: Path) -> None:
    """One machine, other CUDA math modes, or other thread variables: "kernel settings differ",
    naming what sets them, not "on these two machines" with CPU-mode advice."""
    gpu = _kernels(cuda=_gpu(H100))
    tf32 = _kernels(cuda=_gpu(H100, matmul_allow_tf32=True))
    cause = compare_runs(*_pair(tmp_path / "math", gpu, tf32, device="cuda")).causes[0]
    assert (
        "kernel settings differ: CUDA math modes matmul_allow_tf32=False vs matmul_allow_tf32=True" in cause
    )
    assert "determinism.mode sets TF32" in cause and "two machines" not in cause, cause
    eight = _kernels(steering_env={"OMP_NUM_THREADS": "8"})
    cause = compare_runs(*_pair(tmp_path / "threads", _kernels(), eight)).causes[0]
    assert "kernel settings differ: thread variables OMP_NUM_THREADS=unset vs OMP_NUM_THREADS=8" in cause
    assert "set the thread variables alike" in cause and "cpu_isa" not in cause, cause
    eager = _kernels(attention={"implementation": "eager"})
    cause = compare_runs(*_pair(tmp_path / "attention", _kernels(), eager)).causes[0]
    assert "kernel settings differ: attention sdpa vs eager" in cause and "attn_implementation" in cause


def test_thread_variables_are_one_cause_not_two(tmp_path: Path) -> None:
    """The environment's threads section restates the thread variables: named once, in the kernel
    cause (before, "threads.omp_num_threads null vs 8" was a second cause)."""
    one = write_run_dir(
        tmp_path / "a", RunSpec(environment={"kernels": _kernels(), "threads": {"omp_num_threads": None}})
    )
    eight = _kernels(steering_env={"OMP_NUM_THREADS": "8"})
    two = write_run_dir(
        tmp_path / "b",
        RunSpec(noise_from_step=1, environment={"kernels": eight, "threads": {"omp_num_threads": "8"}}),
    )
    causes = compare_runs(one, two).causes
    assert len(causes) == 1 and "OMP_NUM_THREADS=8" in causes[0], causes


def test_every_kernel_fact_is_named_and_traceable(tmp_path: Path) -> None:
    """Two cloud VMs whose CPU model names are the same generic string, other CPU generations (a
    family/model number), or other LAPACK and OpenMP builds: a named kernel cause with the trace
    commands (before: the raw key path, and no trace commands)."""
    newer = _kernels(cpu={"model_number": "207"})
    cause = compare_runs(*_pair(tmp_path / "cpu", _kernels(), newer)).causes[0]
    assert "CPU kernels differ: CPU model number 143 vs 207" in cause and is_traceable_cause(cause), cause
    amd = _kernels(cpu={"vendor": "AuthenticAMD"}, blas={"lapack": "openblas", "openmp": "201811"})
    cause = compare_runs(*_pair(tmp_path / "blas", _kernels(), amd)).causes[0]
    assert "CPU vendor GenuineIntel vs AuthenticAMD; LAPACK mkl vs openblas; OpenMP 201511 vs 201811" in cause
    assert "avx2-compatible on both" in cause and is_traceable_cause(cause), cause


def test_other_library_builds_on_one_hardware_are_the_libraries_not_two_machines(tmp_path: Path) -> None:
    """One CPU, another torch build (its MKL and oneDNN): "kernel libraries differ", advising one
    torch build, not a CPU mode that would not make two MKL versions agree (before: "CPU kernels
    differ ... on these two machines (determinism.cpu_isa ...)")."""
    older = _kernels(blas={"mkl_version": "2024.2", "onednn_version": "v3.5.3"})
    newer = _kernels(blas={"mkl_version": "2025.0", "onednn_version": "v3.7.1"})
    cause = compare_runs(*_pair(tmp_path, older, newer)).causes[0]
    assert "kernel libraries differ: MKL 2024.2 vs 2025.0; oneDNN v3.5.3 vs v3.7.1: other builds" in cause
    assert "one torch build" in cause and "cpu_isa" not in cause and is_traceable_cause(cause), cause
    # a setting that differs beside them keeps its advice (before: only the libraries' was given)
    eight = _kernels(
        blas={"mkl_version": "2025.0", "onednn_version": "v3.7.1"}, steering_env={"OMP_NUM_THREADS": "8"}
    )
    cause = compare_runs(*_pair(tmp_path / "threads", older, eight)).causes[0]
    assert "kernel libraries differ" in cause and "set the thread variables alike" in cause, cause
    avx2 = _kernels(cpu={"aten_capability": "AVX2"}, steering_env={"OMP_NUM_THREADS": "8"})
    cause = compare_runs(*_pair(tmp_path / "machines", _kernels(), avx2)).causes[0]
    assert "CPU kernels differ" in cause and "set the thread variables alike" in cause, cause


def test_gpu_flags_of_cpu_runs_and_restatements_only_where_the_kernel_facts_hold_them(tmp_path: Path) -> None:
    """Two CPU runs, one machine with a GPU: torch's cuDNN and CUDA flags are listed, never a cause
    (nor the kernel facts' cuDNN settings); a CPU run against a record that does not say where it
    computed makes up no difference in CUDA's variables; and without kernel facts, torch's
    parallel_info (its MKL and oneDNN builds) and a GPU of an ``auto`` run stay causes."""
    gpu_flags = {"cuda_available": True, "cudnn_available": True}
    gpu_machine = _kernels(cuda=_gpu(H100), algorithms={"cudnn_benchmark": True})
    one = write_run_dir(
        tmp_path / "a",
        RunSpec(
            config={"determinism": {"device": "cpu"}},
            environment={"kernels": gpu_machine, "determinism": gpu_flags},
        ),
    )
    cpu_only = {"kernels": _kernels(), "determinism": {"cuda_available": False, "cudnn_available": False}}
    two = write_run_dir(
        tmp_path / "b",
        RunSpec(config={"determinism": {"device": "cpu"}}, noise_from_step=1, environment=cpu_only),
    )
    result = compare_runs(one, two)
    assert NOTHING in result.causes[0], result.causes
    facts = _kernels(
        steering_env={"CUBLAS_WORKSPACE_CONFIG": None}
    )  # a CPU run against one that does not say
    assert kernel_differences(comparable(facts, on_gpu=False), comparable(facts, on_gpu=None)) == []

    def old(name: str, gpu: str, parallel: str) -> Path:
        environment = {
            "torch": {"cuda_available": True, "gpus": [{"name": gpu}], "parallel_info": [parallel]}
        }
        spec = RunSpec(config={"determinism": {"device": "auto"}}, noise_from_step=1, environment=environment)
        return write_run_dir(tmp_path / name, spec)

    differences = compare_runs(old("d", "A100", "MKL-DNN v3.5"), old("e", "H100", "MKL-DNN v3.7")).differences
    causes = {d.key for d in differences if not d.inert}
    assert {"environment.torch.gpus", "environment.torch.parallel_info"} <= causes, causes


def test_a_gpu_setting_beside_another_cpu_does_not_make_it_the_gpus_kernels(tmp_path: Path) -> None:
    """One GPU model on both, other CPUs and TF32 on one side only: the machines part in their CPU
    (the cause is "CPU kernels differ", naming the TF32 setting too), not in their GPU."""
    a = _kernels(cuda=_gpu(H100))
    b = _kernels(cuda=_gpu(H100, matmul_allow_tf32=True), cpu={"aten_capability": "AVX2"})
    cause = compare_runs(*_pair(tmp_path, a, b, device="cuda")).causes[0]
    assert "CPU kernels differ: CPU capability AVX512 vs AVX2" in cause and "matmul_allow_tf32" in cause, (
        cause
    )


def test_warn_only_is_no_kernel_setting_between_runs_that_completed(tmp_path: Path) -> None:
    """Deterministic algorithms on both, one only warning: where it would run another kernel, the
    strict run would have stopped, so between two completed runs nothing recorded differs (before:
    "kernel settings differ: ... deterministic_warn_only=False vs True")."""
    warn = _kernels(algorithms={"deterministic_warn_only": True})
    strict = _kernels(algorithms={"deterministic_warn_only": False})
    assert NOTHING in compare_runs(*_pair(tmp_path, strict, warn)).causes[0]
