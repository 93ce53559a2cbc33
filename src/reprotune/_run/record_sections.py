"""The typed sections of a run record (``record.json``; docs/run-directory.md), used by
``_run.record.RunRecord``.

Each section is typed for the keys the contract names and for those reprotune reads back, and
accepts extra keys (a Trainer's resume adds its ``from_checkpoint``...); a key written only by a
later version is optional, so a record written before it still reads.

Importing this module never imports torch.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class RecordPart(BaseModel):
    """A part of the record: typed for the keys the contract names, frozen, extra keys kept."""

    # extra="allow": the contract lists the keys that must mean what docs/run-directory.md says;
    # a run may record more, and a reader must not lose them.
    model_config = ConfigDict(extra="allow", frozen=True)


class ErrorInfo(RecordPart):
    """Why a run failed."""

    type: str
    message: str


class CodeRecord(RecordPart):
    """The code a run used (see :class:`reprotune._run.fingerprint.CodeInfo`)."""

    in_git: bool = False
    commit: str | None = None
    branch: str | None = None
    dirty: bool = False
    diff_sha256: str | None = None
    patch_file: str | None = None
    untracked: list[str] = Field(default_factory=list)


class DataOrderRecord(RecordPart):
    """How a ``reprotune run`` ordered its training rows (``_data.order``); a Trainer-made run has
    none."""

    version: int | None = None
    rows_per_step: int | None = None
    total_steps: int | None = None


class DataRecord(RecordPart):
    """The data a run trained on."""

    source: str | None = None
    file_sha256: str | None = None
    n_rows: int | None = None
    manifest_sha256: str | None = None
    manifest_file: str | None = None
    split_sizes: dict[str, int] = Field(default_factory=dict)
    order: DataOrderRecord | None = None


class ModelRecord(RecordPart):
    """The base model a run started from."""

    source: str | None = None
    revision: str | None = None
    resolved_path: str | None = None
    weights_sha256: str | None = None
    tokenizer_sha256: str | None = None
    dtype: str | None = None
    pad_token_id: int | None = None
    max_length: int | None = None


class Timings(RecordPart):
    """When a run ran and how fast (docs/run-directory.md)."""

    started_at: str
    ended_at: str | None = None
    duration_s: float | None = None
    steps_done: int = 0
    step_time_s_mean: float | None = None
    step_time_s_median: float | None = None
    recording_time_s: float | None = None
    recording_share: float | None = None
    checkpoint_time_s: float | None = None


class Outputs(RecordPart):
    """Hashes of what a run produced."""

    adapter_sha256: str | None = None
    adapter_files: dict[str, str] = Field(default_factory=dict)
    ledger_sha256: str | None = None
    final_val_loss: str | None = None  # the last validation loss as exact float.hex, when measured
    adapter_step: int | None = None  # the step whose weights the adapter holds, when not the last


class WorldSizeChange(RecordPart):
    """A distributed run resumed at another world size (``--allow-world-size-change``)."""

    from_: int = Field(alias="from")
    to: int
    at_step: int
    attempt: int | None = None  # the attempt's index in ``attempts``


class Attempt(RecordPart):
    """One attempt of a run: the first, then one per resume (docs/run-directory.md)."""

    started_at: str | None = None
    resumed: bool = False
    from_step: int | None = None
    rng_restored: bool | None = None
    drift: list[str] = Field(default_factory=list)
    code_drift: list[str] = Field(default_factory=list)
    environment_drift: list[str] = Field(default_factory=list)
    distributed_drift: list[str] = Field(default_factory=list)
    world_size_change: WorldSizeChange | None = None


class TrackerSummary(RecordPart):
    """What one tracker reported at the end (``_trackers.base.TrackerSet.finish``): ``ok`` and the
    tracker's own keys, or ``ok`` false and its ``error``. Typed here: the keys reprotune reads
    back (to tag a run with a verdict, log an eval to it, adopt it into a study)."""

    ok: bool
    error: str | None = None
    tracking_uri: str | None = None  # MLflow
    experiment: str | None = None  # MLflow
    mlflow_run_id: str | None = None
    wandb_run_id: str | None = None
    run_dir: str | None = None  # W&B's run files
    mode: str | None = None  # W&B's
    project: str | None = None  # W&B's


class RankEntry(RecordPart):
    """One rank of a distributed run: who and where, its environment's hash and how that differs
    from rank 0's (``_run.ranks.ranks_section``)."""

    rank: int
    local_rank: int | None = None
    host: str | None = None
    device: str | None = None
    device_name: str | None = None
    environment_sha256: str | None = None
    environment_differs: list[str] = Field(default_factory=list)


class DistributedRecord(RecordPart):
    """A run under torchrun (docs/distributed.md): how its ranks split the work and add it up."""

    world_size: int
    backend: str | None = None
    strategy: str | None = None
    launcher: str | None = None
    nodes: int | None = None
    timeout_s: float | None = None
    micro_batches_per_rank: int | None = None
    placement: str | None = None
    dropout_seeding: str | None = None
    rank_seeds: list[int] = Field(default_factory=list)
    reductions: dict[str, str] = Field(default_factory=dict)
    world_size_invariant: bool | None = None
    ranks: list[RankEntry] = Field(default_factory=list)
    world_size_changes: list[WorldSizeChange] = Field(default_factory=list)


class DeterminismRecord(RecordPart):
    """The determinism settings in force, read back from torch and the environment
    (``_determinism.flags.determinism_flags``); the run's and each environment's."""

    deterministic_algorithms: bool | None = None
    deterministic_warn_only: bool | None = None
    fill_uninitialized_memory: bool | None = None
    cudnn_available: bool | None = None
    cudnn_deterministic: bool | None = None
    cudnn_benchmark: bool | None = None
    cudnn_allow_tf32: bool | None = None
    matmul_allow_tf32: bool | None = None
    float32_matmul_precision: str | None = None
    cublas_workspace_config: str | None = None
    cuda_available: bool | None = None
    torch_num_threads: int | None = None
    torch_num_interop_threads: int | None = None


class LoraRecord(RecordPart):
    """The LoRA adapter's configuration as PEFT holds it: typed for the keys reprotune reads, and
    every other key PEFT writes kept (they change with PEFT's version)."""

    peft_type: str | None = None
    peft_version: str | None = None
    task_type: str | None = None
    base_model_name_or_path: str | None = None
    r: int | None = None
    lora_alpha: int | float | None = None  # as PEFT wrote it: 16 stays 16
    lora_dropout: int | float | None = None
    target_modules: list[str] | str | None = None
    bias: str | None = None


class PythonInfo(RecordPart):
    version: str | None = None
    implementation: str | None = None
    executable: str | None = None


class PlatformInfo(RecordPart):
    system: str | None = None
    release: str | None = None
    machine: str | None = None
    platform: str | None = None
    libc: str | None = None


class CpuInfo(RecordPart):
    model: str | None = None
    logical_cores: int | None = None


class StackInfo(RecordPart):
    """Whether the installed library stack is one CI proves (``_run.stack.stack_facts``)."""

    stack: str | None = None
    differs: dict[str, Any] = Field(default_factory=dict)


class TorchInfo(RecordPart):
    version: str | None = None
    git_version: str | None = None
    cuda: str | None = None
    hip: str | None = None
    cudnn: int | None = None
    cuda_available: bool | None = None
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    parallel_info: list[str] = Field(default_factory=list)


class ThreadsInfo(RecordPart):
    torch_intra_op: int | None = None
    torch_inter_op: int | None = None
    omp_num_threads: str | None = None
    mkl_num_threads: str | None = None
    openblas_num_threads: str | None = None
    tokenizers_parallelism: str | None = None


class EnvironmentRecord(RecordPart):
    """The machine and software a run's numbers can depend on (``_run.fingerprint.environment_fingerprint``).
    ``kernels`` has a version of its own and is read by ``_run.kernels``, which says "unknown" of a
    fact a record lacks."""

    python: PythonInfo | None = None
    platform: PlatformInfo | None = None
    cpu: CpuInfo | None = None
    distributions: dict[str, str | None] = Field(default_factory=dict)
    stack: StackInfo | None = None
    torch: TorchInfo | None = None
    gpu_driver: str | None = None
    nvidia_smi_gpus: list[dict[str, Any]] = Field(default_factory=list)
    threads: ThreadsInfo | None = None
    determinism: DeterminismRecord | None = None
    env: dict[str, str] = Field(default_factory=dict)
    kernels: dict[str, Any] | None = None
