"""``reprotune run``: a LoRA fine-tune in which every source of randomness is explicit and every
optimizer step is written to the ledger with exact bits.

Read top to bottom: prepare (seeds, determinism, data and split, fingerprints, model, LoRA),
then the loop (one optimizer step = ``grad_accum_steps`` micro-batches), then the outputs
(adapter, record). The run directory layout is in docs/run-directory.md.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from reprotune._checkpoint import (
    CheckpointState,
    latest_valid_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from reprotune._config import ExperimentConfig, config_sha256, dump_config_yaml
from reprotune._data_order import ORDER_VERSION, DataOrder
from reprotune._determinism import apply_determinism
from reprotune._errors import InputError
from reprotune._faults import kill_point
from reprotune._fingerprint import code_fingerprint, environment_fingerprint
from reprotune._formatting import collate, encode_row
from reprotune._jsonio import sha256_file, write_bytes_atomic
from reprotune._ledger import LEDGER_FILE, LedgerWriter, batch_sha256, hexf, truncate_ledger
from reprotune._lora import WeightsHasher, apply_lora, lora_config_dict, save_adapter, trainable_tensors
from reprotune._model import load_base_model
from reprotune._optim import build_optimizer, build_scheduler
from reprotune._record import load_record, make_run_id, utc_now, write_record
from reprotune._rerun import environment_drift as _environment_drift
from reprotune._rundata import RunData, prepare_data
from reprotune._seeding import derive_seeds
from reprotune._trackers import MlflowTracker, RunDescription, TrackerSet, flatten_params
from reprotune._version import __version__

RECORD_FILE = "record.json"
CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "split.json"
ADAPTER_DIR = "adapter"
PATCH_FILE = "code.patch"


@dataclass(frozen=True)
class RunOptions:
    """How to run, beyond what the config says.

    Args:
        run_dir: where to write; default ``runs/<run-id>`` under the current directory.
        progress: show a progress bar on stderr.
        tracking: mirror to the trackers the config enables (False: none, e.g. in verify's legs).
        stop_after_step: stop after this optimizer step as if interrupted (verify's resume leg),
            leaving the run resumable.
        restore_rng_on_resume: False only for verify's negative control of the resume leg.
        manifest: train on this split manifest instead of the config's split (rerun uses the
            recorded run's ``split.json``; the config, and so its hash, stay as recorded).
        recording: which optimizer steps write their ledger line (with the weights hash) and send
            their metrics to the trackers: every one (True, the default), none (False) or those a
            predicate ``step -> bool`` picks. Anything but True is for the overhead benchmark only,
            which compares recorded and unrecorded steps of one loop; such a run's ledger is not
            complete, and ``compare`` and ``resume`` cannot use it.
        code_dir: the directory whose git state is recorded.
    """

    run_dir: Path | None = None
    progress: bool = True
    tracking: bool = True
    stop_after_step: int | None = None
    restore_rng_on_resume: bool = True
    manifest: Path | None = None
    recording: bool | Callable[[int], bool] = True
    code_dir: Path = field(default_factory=Path.cwd)


@dataclass(frozen=True)
class RunResult:
    """What a finished (or deliberately stopped) run produced."""

    run_dir: Path
    record: dict[str, Any]
    status: str
    steps_done: int
    adapter_sha256: str | None
    final_val_loss: float | None
    step_times_s: tuple[float, ...] = ()
    """This attempt's wall time per optimizer step, in step order (the benchmarks read it)."""


def new_run_dir(cfg: ExperimentConfig, base: Path = Path("runs")) -> Path:
    """``runs/<run id>`` (``make_run_id``: UTC time and config hash), with a suffix if that exists."""
    run_id = make_run_id(cfg)
    candidate, suffix = base / run_id, 1
    while candidate.exists():
        suffix += 1
        candidate = base / f"{run_id}-{suffix}"
    return candidate


def _claim_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` for a new run, refusing one that already holds a run."""
    record = run_dir / RECORD_FILE
    if record.exists():
        status = load_record(record).get("status")
        if status == "completed":
            raise InputError(
                f"run directory {run_dir} already holds a completed run",
                source=str(record),
                fix="choose a new directory with --run-dir, or leave it out for a fresh runs/<id>",
            )
        raise InputError(
            f"run directory {run_dir} holds an unfinished run (status {status!r})",
            source=str(record),
            fix=f"continue it with `reprotune resume {run_dir}`, or choose a new directory with --run-dir",
        )
    for leftover in _unlanded_first_record(run_dir):
        leftover.unlink()  # a start killed before its first record landed: nothing was trained
    if run_dir.exists() and any(run_dir.iterdir()):
        raise InputError(
            f"run directory {run_dir} exists and is not empty",
            fix="choose a new directory with --run-dir",
        )
    run_dir.mkdir(parents=True, exist_ok=True)


def _unlanded_first_record(run_dir: Path) -> list[Path]:
    """The temporary files of a first ``record.json`` that never landed, when nothing else is there.

    The record is the first file a run writes, so a start killed while writing it leaves only
    these; the directory is then as good as empty.
    """
    if not run_dir.is_dir() or (run_dir / RECORD_FILE).exists():
        return []
    entries = list(run_dir.iterdir())
    temporary = [p for p in entries if p.name.startswith(f".{RECORD_FILE}.") and p.name.endswith(".tmp")]
    return temporary if temporary and len(temporary) == len(entries) else []


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError(
            "determinism.device is 'cuda' but torch sees no CUDA device",
            source="determinism.device",
            fix="set determinism.device to 'cpu' or 'auto'",
        )
    return torch.device(name)


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def supports_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the (base) model's ``forward`` takes ``logits_to_keep`` (transformers' causal LMs do)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def logits_to_keep(labels: torch.Tensor) -> int:
    """How many trailing positions need logits: from the first one whose next token is labelled.

    The prompt before it is never scored, so its logits (a ``vocab``-wide row per position, the
    largest activation of a small model) need not be computed. Give CPU labels: this reads them.
    """
    scored = (labels[:, 1:] != -100).any(dim=0).nonzero()
    first = int(scored[0]) if len(scored) else labels.shape[1] - 1
    return int(labels.shape[1]) - first


def token_loss_sum(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], *, keep: int | None = None
) -> torch.Tensor:
    """Sum of next-token cross-entropy over the labelled (response) tokens.

    Args:
        model: the causal LM.
        batch: ``input_ids``, ``attention_mask``, ``labels`` (-100 where not scored), ``position_ids``.
        keep: compute logits only for the last ``keep`` positions (:func:`logits_to_keep`; the
            model must take ``logits_to_keep``); None: every position.
    """
    extra = {} if keep is None else {"logits_to_keep": keep}
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch.get("position_ids"),
        **extra,
    ).logits
    # Position p predicts token p + 1: shift the labels (not the logits, which would copy them).
    length, kept = batch["labels"].shape[1], logits.shape[1]
    labels = F.pad(batch["labels"][:, length - kept + 1 :], (0, 1), value=-100)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100, reduction="sum"
    )


class Examples:
    """Tokenised rows, encoded on first use and cached (tokenisation happens after the split)."""

    def __init__(self, data: RunData, tokenizer: Any, cfg: ExperimentConfig) -> None:
        self._data = data
        self._tokenizer = tokenizer
        self._cfg = cfg
        self._cache: dict[int, tuple[list[int], list[int]]] = {}

    def get(self, row: int) -> tuple[list[int], list[int]]:
        hit = self._cache.get(row)
        if hit is None:
            hit = encode_row(
                self._tokenizer,
                self._data.table.row(row),
                row_index=row,
                prompt_field=self._cfg.data.prompt_field,
                response_field=self._cfg.data.response_field,
                system_prompt=self._cfg.data.system_prompt,
                prompt_template=self._cfg.data.prompt_template,
                max_length=self._cfg.model.max_length,
                source=self._data.table.source,
            )
            self._cache[row] = hit
        return hit

    def batch(self, rows: list[int], *, pad_token_id: int, padding_side: str) -> dict[str, torch.Tensor]:
        return collate([self.get(r) for r in rows], pad_token_id=pad_token_id, padding_side=padding_side)


def _micro_batches(rows: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    examples: Examples,
    rows: list[int],
    *,
    batch_size: int,
    pad_token_id: int,
    padding_side: str,
    device: torch.device,
    precision: str,
    keep_logits: bool = False,
) -> tuple[float, int]:
    """Mean token loss over ``rows`` (summed in float64, so the batch size barely matters).

    ``keep_logits``: compute logits only from the first scored position (see ``token_loss_sum``).
    """
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for chunk in _micro_batches(rows, batch_size):
        on_cpu = examples.batch(chunk, pad_token_id=pad_token_id, padding_side=padding_side)
        keep = logits_to_keep(on_cpu["labels"]) if keep_logits else None
        n = int((on_cpu["labels"][:, 1:] != -100).sum())
        batch = {k: v.to(device) for k, v in on_cpu.items()}
        with _autocast(precision, device):
            loss_sum = token_loss_sum(model, batch, keep=keep)
        total += float(loss_sum)
        tokens += n
    model.train(was_training)
    return (total / tokens if tokens else math.nan), tokens


@contextlib.contextmanager
def _hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Show transformers' own progress bars (loading weights) only when ours are shown."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _progress(total: int, initial: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="step",
        desc="train",
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
        mininterval=0.5,
    )


def _trackers(cfg: ExperimentConfig, options: RunOptions, report: Callable[[str], None]) -> TrackerSet:
    trackers: list[Any] = []
    if options.tracking and cfg.tracking.mlflow:
        trackers.append(
            MlflowTracker(cfg.tracking.uri, cfg.tracking.artifact_location, cfg.tracking.experiment)
        )
    return TrackerSet(trackers, report=report)


def _write_record(run_dir: Path, record: dict[str, Any]) -> None:
    write_record(run_dir / RECORD_FILE, record)


def run_experiment(cfg: ExperimentConfig, options: RunOptions = RunOptions()) -> RunResult:
    """Run the experiment ``cfg`` in a new run directory. See the module docstring.

    Raises:
        InputError: bad data, model or config discovered while preparing (the record says failed).
    """
    run_dir = options.run_dir or new_run_dir(cfg)
    _claim_run_dir(run_dir)
    with _hf_progress_bars(options.progress):
        return _execute(cfg, run_dir, options, resume=False)


def resume_run(run_dir: Path, options: RunOptions = RunOptions()) -> RunResult:
    """Continue the unfinished run in ``run_dir`` from its latest valid checkpoint."""
    from reprotune._config import config_from_dict

    record_path = run_dir / RECORD_FILE
    if _unlanded_first_record(run_dir):
        raise InputError(
            f"the run in {run_dir} was killed before its first record was written; nothing was trained",
            source=str(run_dir),
            fix=f"start it again with `reprotune run CONFIG --run-dir {run_dir}`",
        )
    if not record_path.exists():
        raise InputError(
            f"{run_dir} is not a run directory (no {RECORD_FILE})",
            source=str(run_dir),
            fix="point at a directory written by `reprotune run`",
        )
    record = load_record(record_path)
    if record.get("status") == "completed":
        raise InputError(
            f"the run in {run_dir} is already complete; nothing to resume",
            source=str(record_path),
            fix=f"compare it with `reprotune compare`, or start a new one with `reprotune rerun {run_dir}`",
        )
    cfg = config_from_dict(record["config"], source=str(record_path))
    with _hf_progress_bars(options.progress):
        return _execute(cfg, run_dir, options, resume=True, previous=record)


def _execute(
    cfg: ExperimentConfig,
    run_dir: Path,
    options: RunOptions,
    *,
    resume: bool,
    previous: dict[str, Any] | None = None,
) -> RunResult:
    started = time.perf_counter()
    seeds = derive_seeds(cfg.seed.root, dict(cfg.seed.overrides))
    record: dict[str, Any] = (
        dict(previous)
        if previous
        else {
            "run_id": run_dir.name,
            "reprotune_version": __version__,
            "config": cfg.resolved(),
            "config_sha256": config_sha256(cfg),
            "seeds": seeds,
            "timings": {"started_at": utc_now()},
            "attempts": [],
        }
    )
    record["status"] = "running"
    record["error"] = None
    record.setdefault("attempts", []).append({"started_at": utc_now(), "resumed": resume})
    _write_record(run_dir, record)  # first: a directory with a record is a run, whatever happens next
    if not resume:
        dump_config_yaml(cfg, run_dir / CONFIG_FILE)

    messages: list[str] = []

    def report(line: str) -> None:
        messages.append(line)
        print(line, file=sys.stderr, flush=True)

    trackers = TrackerSet([], report=report)
    bar = None
    try:
        trackers = _trackers(cfg, options, report)
        device = _device(cfg.determinism.device)
        record["determinism"] = apply_determinism(cfg.determinism.mode, cfg.determinism.threads, device.type)

        manifest_path = run_dir / MANIFEST_FILE
        data = prepare_data(cfg, seeds, manifest_path, reuse_manifest=resume, manifest=options.manifest)
        record["data"] = data.describe()
        for warning in data.split_warnings:
            report(f"warning: {warning}")

        code = code_fingerprint(options.code_dir)
        code_record = code.to_record(patch_file=PATCH_FILE if code.dirty else None)
        environment = environment_fingerprint()
        if resume and previous is not None and "code" in previous:
            # A resumed run must be the run that started: same code. The record keeps the identity
            # the run started with; an environment that moved is noted on this attempt.
            _refuse_code_drift(previous["code"], code_record, run_dir)
            drift = _environment_drift(previous.get("environment", {}), environment)
            record["attempts"][-1]["environment_drift"] = drift
            for line in drift:
                report(f"warning: environment differs from the run's start: {line}")
        else:
            record["code"] = code_record
            if code.dirty and code.diff is not None:
                write_bytes_atomic(run_dir / PATCH_FILE, code.diff)
            record["environment"] = environment

        loaded = load_base_model(
            cfg.model.name,
            revision=cfg.model.revision,
            dtype=cfg.model.dtype,
            pad_token_id=cfg.model.pad_token_id,
            padding_side=cfg.model.padding_side,
            device=str(device),
        )
        record["model"] = {
            **loaded.info,
            "max_length": cfg.model.max_length,
            "padding_side": cfg.model.padding_side,
        }
        pad_token_id = int(loaded.info["pad_token_id"])
        lora_kwargs = dict(
            r=cfg.lora.r,
            alpha=cfg.lora.alpha,
            dropout=cfg.lora.dropout,
            target_modules=list(cfg.lora.target_modules),
            bias=cfg.lora.bias,
        )
        model = apply_lora(loaded.model, seed=seeds["lora_init"], **lora_kwargs)  # type: ignore[arg-type]
        model.to(device)
        record["lora"] = lora_config_dict(model)
        # Logits only where the loss reads them (the same losses, less work), if the model can.
        keep_logits = supports_logits_to_keep(model)

        rows_per_step = cfg.train.batch_size * cfg.train.grad_accum_steps
        order = DataOrder(seeds["data_order"], data.split_rows("train"), rows_per_step)
        if cfg.train.max_steps is not None:
            total_steps = cfg.train.max_steps
        else:
            assert cfg.train.epochs is not None  # the config guarantees exactly one of the two
            total_steps = order.steps_for_epochs(cfg.train.epochs)
        record["data"]["order"] = {
            "version": ORDER_VERSION,
            "rows_per_step": rows_per_step,
            "total_steps": total_steps,
        }
        val_rows = data.eval_rows(seeds["eval"])
        examples = Examples(data, loaded.tokenizer, cfg)

        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = build_optimizer(
            trainable,
            name=cfg.train.optimizer,
            learning_rate=cfg.train.learning_rate,
            weight_decay=cfg.train.weight_decay,
        )
        scheduler = build_scheduler(
            optimizer,
            schedule=cfg.train.scheduler,
            warmup_steps=cfg.train.warmup_steps,
            total_steps=total_steps,
        )
        scaler = torch.amp.GradScaler(device.type) if cfg.train.precision == "fp16" else None

        ledger_path = run_dir / LEDGER_FILE
        checkpoint_dir = run_dir / "checkpoints"
        start_step = 0
        if resume:
            found = latest_valid_checkpoint(checkpoint_dir, report=report)
            if found is None:
                # Nothing to restore: start over, from a clean ledger.
                ledger_path.unlink(missing_ok=True)
            else:
                state = restore_checkpoint(
                    found,
                    model=model,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    scaler=scaler,
                    restore_rng=options.restore_rng_on_resume,
                )
                start_step = state.step
                truncate_ledger(ledger_path, keep_through_step=start_step)
                report(f"resuming {run_dir} from step {start_step} ({found.name})")
        else:
            ledger_path.unlink(missing_ok=True)
        if start_step == 0:
            # Dropout (and anything else drawing from torch's global generator) gets its own seed.
            torch.manual_seed(seeds["dropout"])

        run_info = RunDescription(
            run_id=record["run_id"],
            run_dir=run_dir,
            params=flatten_params(record["config"]),
            tags=_tracker_tags(record),
        )
        trackers.start(run_info)
        _write_record(run_dir, record)

        model.train()
        # Detached views of the trainable parameters: the optimizer updates them in place, so
        # one hasher built now hashes the current weights after every step.
        hash_weights = WeightsHasher(trainable_tensors(model))
        records_step = _step_predicate(options.recording)
        step_times: list[float] = []
        # Time in each recorded step's ledger line (formatting included when the ledger's flush
        # falls in it), weights hash and tracker hand-off: what recording cost, for the record.
        recording_s = 0.0
        final_val: float | None = None
        bar = _progress(total_steps, start_step, options.progress)
        # Everything loaded so far (torch, transformers, the model) lives for the whole run: keep it
        # out of the garbage collector's full passes, which otherwise stall steps at random.
        gc.collect()
        gc.freeze()
        with LedgerWriter(ledger_path) as ledger:
            if start_step == 0:
                ledger.write({"kind": "init", "step": 0, "weights_sha256": hash_weights()})
            for step in range(start_step + 1, total_steps + 1):
                t0 = time.perf_counter()
                rows = order.step_rows(step)
                epoch, _ = order.position(step)
                on_cpu = [
                    examples.batch(chunk, pad_token_id=pad_token_id, padding_side=cfg.model.padding_side)
                    for chunk in _micro_batches(rows, cfg.train.batch_size)
                ]
                # Counted before the copy to the device: no host sync per micro-batch.
                n_tokens = sum(int((b["labels"][:, 1:] != -100).sum()) for b in on_cpu)
                keeps = [logits_to_keep(b["labels"]) if keep_logits else None for b in on_cpu]
                batches = [{k: v.to(device) for k, v in b.items()} for b in on_cpu]
                lr = optimizer.param_groups[0]["lr"]
                step_loss = 0.0
                for batch, keep in zip(batches, keeps, strict=True):
                    with _autocast(cfg.train.precision, device):
                        loss_sum = token_loss_sum(model, batch, keep=keep)
                    loss = loss_sum / max(n_tokens, 1)
                    (scaler.scale(loss) if scaler else loss).backward()
                    step_loss += float(loss.detach())
                if scaler:
                    scaler.unscale_(optimizer)
                max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm is not None else math.inf
                grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, max_norm))
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                recorded = records_step(step)
                if recorded:
                    r0 = time.perf_counter()
                    # The weights are hashed now (the next step changes them); the line is built
                    # at the ledger's next flush, with the lines of the steps around it.
                    ledger.write(
                        functools.partial(
                            _train_line, step, epoch, rows, n_tokens, step_loss, lr, grad_norm, hash_weights()
                        )
                    )
                    recording_s += time.perf_counter() - r0
                metrics = {"train_loss": step_loss, "lr": lr, "grad_norm": grad_norm}
                is_last = step == total_steps
                if val_rows and ((cfg.train.eval_every and step % cfg.train.eval_every == 0) or is_last):
                    final_val, val_tokens = evaluate(
                        model,
                        examples,
                        val_rows,
                        batch_size=cfg.eval.batch_size,
                        pad_token_id=pad_token_id,
                        padding_side=cfg.model.padding_side,
                        device=device,
                        precision=cfg.train.precision,
                        keep_logits=keep_logits,
                    )
                    ledger.write(
                        {
                            "kind": "val",
                            "step": step,
                            "loss": hexf(final_val),
                            "n_rows": len(val_rows),
                            "n_tokens": val_tokens,
                        }
                    )
                    metrics["val_loss"] = final_val
                if recorded:
                    r0 = time.perf_counter()
                    trackers.log_metrics(step, metrics)
                    recording_s += time.perf_counter() - r0
                if cfg.train.save_every and step % cfg.train.save_every == 0 and not is_last:
                    ledger.sync()
                    save_checkpoint(
                        checkpoint_dir,
                        CheckpointState(step=step, epoch=epoch, position=order.position(step + 1)),
                        model=model,
                        optimizer=optimizer,
                        scheduler=scheduler,
                        scaler=scaler,
                        keep=cfg.train.keep_checkpoints,
                    )
                kill_point("step-end")
                step_times.append(time.perf_counter() - t0)
                bar.set_postfix(
                    loss=f"{step_loss:.4f}", tok_s=f"{n_tokens / step_times[-1]:.0f}", refresh=False
                )
                bar.update(1)
                if options.stop_after_step is not None and step >= options.stop_after_step and not is_last:
                    bar.close()
                    record["status"] = "stopped"
                    record["timings"].update(_timings(started, step_times, step, recording_s))
                    trackers.finish("stopped")
                    _write_record(run_dir, record)
                    return RunResult(
                        run_dir, record, "stopped", step, None, final_val, step_times_s=tuple(step_times)
                    )
        bar.close()

        adapter_files = save_adapter(model, run_dir / ADAPTER_DIR)
        record["outputs"] = {
            "adapter_files": adapter_files,
            "adapter_sha256": adapter_files.get("adapter_model.safetensors"),
            "ledger_sha256": sha256_file(ledger_path),
            "final_val_loss": hexf(final_val) if final_val is not None else None,
        }
        record["timings"].update(_timings(started, step_times, total_steps, recording_s))
        record["status"] = "completed"
        _write_record(run_dir, record)
        trackers.log_artifacts(
            {
                "": run_dir / RECORD_FILE,
                "ledger": ledger_path,
                "adapter": run_dir / ADAPTER_DIR,
                "split": manifest_path,
                "config": run_dir / CONFIG_FILE,
            }
        )
        record["trackers"] = trackers.finish("completed")
        _write_record(run_dir, record)
        return RunResult(
            run_dir,
            record,
            "completed",
            total_steps,
            record["outputs"]["adapter_sha256"],
            final_val,
            step_times_s=tuple(step_times),
        )
    except BaseException as exc:
        if bar is not None:
            bar.close()
        record["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        record["error"] = {"type": type(exc).__name__, "message": str(exc)}
        record["timings"]["ended_at"] = utc_now()
        with contextlib.suppress(Exception):
            record["trackers"] = trackers.finish(record["status"])
        _write_record(run_dir, record)
        raise
    finally:
        gc.unfreeze()


def _refuse_code_drift(started: dict[str, Any], now: dict[str, Any], run_dir: Path) -> None:
    """Raise when the code differs from the code the run started with (commit, dirty flag, diff)."""
    drift = [
        f"code.{key}: run started with {started.get(key)!r}, now {now.get(key)!r}"
        for key in ("commit", "dirty", "diff_sha256")
        if started.get(key) != now.get(key)
    ]
    if drift:
        raise InputError(
            "the code differs from the code this run started with:\n  " + "\n  ".join(drift),
            source=str(run_dir / RECORD_FILE),
            fix=f"check out commit {started.get('commit')} (and apply {run_dir / PATCH_FILE} if the run "
            "was dirty) before resuming, or start a new run",
        )


def _train_line(
    step: int,
    epoch: int,
    rows: list[int],
    n_tokens: int,
    loss: float,
    lr: float,
    grad_norm: float,
    weights_sha256: str,
) -> dict[str, Any]:
    """One optimizer step's ledger entry (fields in docs/run-directory.md)."""
    return {
        "kind": "train",
        "step": step,
        "epoch": epoch,
        "batch_sha256": batch_sha256(rows),
        "n_rows": len(rows),
        "n_tokens": n_tokens,
        "loss": hexf(loss),
        "lr": hexf(lr),
        "grad_norm": hexf(grad_norm),
        "weights_sha256": weights_sha256,
    }


def _step_predicate(recording: bool | Callable[[int], bool]) -> Callable[[int], bool]:
    if callable(recording):
        return recording
    return (lambda _step: True) if recording else (lambda _step: False)


def _timings(started: float, step_times: list[float], steps_done: int, recording_s: float) -> dict[str, Any]:
    total = sum(step_times)
    return {
        "ended_at": utc_now(),
        "duration_s": round(time.perf_counter() - started, 3),
        "steps_done": steps_done,
        "step_time_s_mean": round(float(np.mean(step_times)), 6) if step_times else None,
        # The median ignores the first step's warm-up and one-off stalls: the loop's typical pace.
        "step_time_s_median": round(float(np.median(step_times)), 6) if step_times else None,
        # The ledger lines, weights hashes and tracker hand-offs of this attempt's steps, timed
        # where they run: what recording cost this run, as a share of its step time.
        "recording_time_s": round(recording_s, 6),
        "recording_share": round(recording_s / total, 6) if total else None,
    }


def _tracker_tags(record: dict[str, Any]) -> dict[str, str]:
    code, data, model = record.get("code", {}), record.get("data", {}), record.get("model", {})
    return {
        "reprotune.version": __version__,
        "reprotune.run_id": record["run_id"],
        "git.commit": str(code.get("commit")),
        "git.dirty": str(code.get("dirty")),
        "data.sha256": str(data.get("file_sha256")),
        "data.manifest_sha256": str(data.get("manifest_sha256")),
        "model.source": str(model.get("source")),
        "model.weights_sha256": str(model.get("weights_sha256")),
        "config.sha256": record["config_sha256"],
    }
