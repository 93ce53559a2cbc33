"""What two run records differ in: every recorded value, by key path, in its category. No torch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from reprotune._config.schema import NEUTRAL_DEFAULTS
from reprotune._jsonio import empty_beside_keys, flattened
from reprotune._proof.differences import Category, Difference
from reprotune._proof.inert import is_inert
from reprotune._proof.microscope import compared_kernels, computed_on_gpu
from reprotune._proof.rank_diff import RANKS, Inert, rank_differences
from reprotune._proof.stack_causes import BUFFERS_PREFIX
from reprotune._proof.world import TRAINER_WORLD_SIZE, trainer_world_sizes
from reprotune._run.drift import added_later
from reprotune._run.kernel_compare import CUDA_VARIABLES
from reprotune._run.rundir import RunDir

# Record section -> the category its differences are listed under. Sections left out (run_id,
# status, timings, outputs, config_sha256) are results or identities, not possible causes;
# lora_defaults says what the lora section's values mean (_off_beside_absent).
_SECTIONS: dict[str, Category] = {
    "config": "config",
    "seeds": "seeds",
    "code": "code",
    "reprotune_version": "code",
    "data": "data",
    "model": "model",
    "lora": "lora",
    "environment": "environment",
    "distributed": "distributed",
}


_KERNELS = "environment.kernels."
_CUDA_KERNELS = f"{_KERNELS}cuda"
_STEERING = f"{_KERNELS}steering_env."
#: ``environment.determinism`` flags that only a GPU reads.
_GPU_FLAGS = (
    "cuda_available",
    "cudnn_available",
    "cudnn_deterministic",
    "cudnn_benchmark",
    "cudnn_allow_tf32",
    "matmul_allow_tf32",
    "cublas_workspace_config",
    "fp32_precision_cuda_matmul",
    "fp32_precision_cudnn",
    "fp32_precision_cudnn_conv",
    "fp32_precision_cudnn_rnn",
)
_NO_DEFAULT = object()
_NEUTRAL = {f"config.{key}": value for key, value in NEUTRAL_DEFAULTS.items()}


def record_differences(run_a: RunDir, run_b: RunDir) -> Iterable[Difference]:
    """Every recorded value that differs, by section, in key-path order. Kernel facts are their
    own category; they and the base model's buffers (``model.buffers``) are compared only when
    both records hold them (older records do not: unknown). A key one record lacks because it
    predates it, at the value that meant the same (``NEUTRAL_DEFAULTS``), is no difference; a
    LoRA config field one PEFT version writes and the other's lacks, its feature off where it is
    written (:func:`_off_beside_absent`), is listed and inert. A torchrun run's ranks are compared
    rank by rank (``rank_diff``: what each ran with can change the numbers, where it ran cannot),
    and two Trainer-made runs' world sizes as ``trainer.world_size`` (:func:`_trainer_world`)."""
    kernels = compared_kernels(run_a, run_b)
    both_kernels = kernels[0] is not None and kernels[1] is not None
    unused_gpu = _unused_gpu_keys(run_a, run_b, both_kernels)
    both_buffers = all("buffers" in run.section("model") for run in (run_a, run_b))
    defaults = _lora_defaults(run_a), _lora_defaults(run_b)
    for section, section_category in _SECTIONS.items():
        flat_a, flat_b = _flat(run_a, section, kernels[0]), _flat(run_b, section, kernels[1])
        # load_best_model_at_end: the save_* arguments choose which checkpoint is the adapter
        best = any(flat.get("config.trainer.args.load_best_model_at_end") for flat in (flat_a, flat_b))
        for key in sorted(set(flat_a) | set(flat_b)):
            if key == RANKS:
                yield from rank_differences(run_a, run_b, _rank_inert(run_a, run_b, unused_gpu))
            if key == RANKS or key.startswith(f"{RANKS}["):  # a resume's rank values: rank_differences
                continue
            inert = (
                (
                    is_inert(key, flat_a.get(key), flat_b.get(key))
                    and not (best and key.startswith("config.trainer.args.save_"))
                )
                or (section == "lora" and _off_beside_absent(key, (flat_a, flat_b), defaults))
                or key in unused_gpu
            )
            category: Category = "kernels" if key.startswith(_KERNELS) else section_category
            if category == "kernels" and not both_kernels:
                continue
            if (key == "model.buffers" or key.startswith(BUFFERS_PREFIX)) and not both_buffers:
                continue  # a record made before reprotune hashed buffers: unknown, not different
            if key in _NEUTRAL and flat_a.get(key, _NEUTRAL[key]) == flat_b.get(key, _NEUTRAL[key]):
                continue
            if empty_beside_keys(key, flat_a, flat_b):
                continue
            if (key in flat_a) != (key in flat_b) and added_later(*key.rpartition(".")[::2]):
                continue  # a record made before it was read: unknown
            if key not in flat_b:
                yield Difference(category, key, flat_a[key], None, "removed", inert)
            elif key not in flat_a:
                yield Difference(category, key, None, flat_b[key], "added", inert)
            elif flat_a[key] != flat_b[key] or type(flat_a[key]) is not type(flat_b[key]):
                yield Difference(category, key, flat_a[key], flat_b[key], "changed", inert)
    yield from _trainer_world(run_a, run_b)


def _trainer_world(run_a: RunDir, run_b: RunDir) -> Iterable[Difference]:
    """The world sizes of two Trainer-made runs, where they differ: such a record has no
    ``distributed`` section, and its ``trainer`` section (arguments the config restates, the ranks,
    steps per epoch) is not compared otherwise; at another world size every step trains on another
    global batch, dealt to the ranks by the sampler."""
    sizes = trainer_world_sizes(run_a, run_b)
    if sizes is not None and sizes[0] != sizes[1]:
        yield Difference("distributed", TRAINER_WORLD_SIZE, sizes[0], sizes[1], "changed")


def _flat(run: RunDir, section: str, kernels: Mapping[str, object] | None) -> dict[str, object]:
    """The record's ``section`` flattened, its kernel facts as compared (``compared_kernels``)."""
    value = run.record.get(section)
    if section not in run.record:
        return {}
    if section == "environment" and kernels is not None and isinstance(value, Mapping):
        value = {**value, "kernels": kernels}
    return flattened(value, section)


#: Environment facts the kernel facts restate: which GPUs the machine had (their count and
#: UUIDs; the kernel facts hold the models), and torch's summary of its threads and libraries
#: (the kernel facts hold the libraries' builds, ``environment.threads`` the threads).
_RESTATED = ("environment.torch.gpus", "environment.nvidia_smi_gpus", "environment.torch.parallel_info")
#: And what a GPU the run did not use adds: whether there was one, its driver, CUDA's variables
#: and the cuDNN and CUDA flags torch holds for it.
_GPU_USE = (
    "environment.torch.cuda_available",
    "environment.gpu_driver",
    *(f"environment.determinism.{name}" for name in _GPU_FLAGS),
    *(f"environment.env.{name}" for name in sorted(CUDA_VARIABLES)),
)


def _unused_gpu_keys(run_a: RunDir, run_b: RunDir, both_kernels: bool) -> frozenset[str]:
    """Facts that cannot have changed the numbers, listed but never a cause: the environment's
    restatements of the kernel facts (:data:`_RESTATED`) when both records hold them, and every
    GPU fact (:data:`_GPU_USE`) when neither run computed on a GPU."""
    keys: tuple[str, ...] = _RESTATED if both_kernels else ()
    if computed_on_gpu(run_a) is False and computed_on_gpu(run_b) is False:
        keys = (*keys, "environment.torch.gpus", "environment.nvidia_smi_gpus", *_GPU_USE)
    return frozenset(keys)


def _rank_inert(run_a: RunDir, run_b: RunDir, unused_gpu: frozenset[str]) -> Inert:
    """Whether an environment value a torchrun rank ran with cannot change the numbers: as the
    record's own value could not (``is_inert``, :func:`_unused_gpu_keys`), and where neither run
    computed on a GPU, a CUDA kernel fact or variable (``kernel_compare.comparable``)."""
    on_cpu = computed_on_gpu(run_a) is False and computed_on_gpu(run_b) is False

    def inert(key: str, a: object, b: object) -> bool:
        cuda = key.startswith(_CUDA_KERNELS) or key.removeprefix(_STEERING) in CUDA_VARIABLES
        return is_inert(key, a, b) or key in unused_gpu or (on_cpu and cuda)

    return inert


def _lora_defaults(run: RunDir) -> dict[str, object] | None:
    """The defaults of the LoRA config's fields in the PEFT that made ``run``, flattened as its
    ``lora`` section is; None for a record made before reprotune wrote them."""
    defaults = run.record.get("lora_defaults")
    return flattened(defaults, "lora") if isinstance(defaults, Mapping) else None


def _off_beside_absent(
    key: str,
    flats: tuple[dict[str, object], dict[str, object]],
    defaults: tuple[dict[str, object] | None, dict[str, object] | None],
) -> bool:
    """A key one record lacks (its PEFT has no such field, so no such feature) while the other
    holds it with the feature off: at its PEFT's default (``lora_defaults``), or, in a record made
    before reprotune wrote the defaults, unset (null, false, empty)."""
    (flat_a, flat_b), (defaults_a, defaults_b) = flats, defaults
    if (key in flat_a) == (key in flat_b):
        return False
    value, holder_defaults = (flat_a[key], defaults_a) if key in flat_a else (flat_b[key], defaults_b)
    if holder_defaults is not None:
        default = holder_defaults.get(key, _NO_DEFAULT)
        return default == value and type(default) is type(value)
    return value is None or value is False or value in ([], {}, "")
