"""``ReprotuneCallback``: reprotune's run directory from a Hugging Face ``Trainer`` or TRL script.

Three added lines give a script the record, ledger and adapter ``reprotune run`` writes, so that
``reprotune compare``, ``report`` and ``verify --command`` work on its runs::

    import reprotune
    from reprotune.integrations.transformers import ReprotuneCallback

    reprotune.seed_everything(args.seed)               # before the model and its LoRA are built
    trainer = Trainer(..., callbacks=[ReprotuneCallback()])

The ledger has one line per optimizer step with the exact loss, learning rate and gradient norm
(``float.hex``), the dataset indices the Trainer drew and the trainable weights' sha256, whatever
``logging_steps`` is; the Trainer's own order and numbers are untouched (``_probes``). At train
begin the callback warns about settings that break reproducibility and records them
(``_findings``). Under ``reprotune verify --command`` it follows the controls of ``controls``.
See docs/integrations.md.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from reprotune._data.manifest import Manifest, load_manifest
from reprotune._errors import Interrupted
from reprotune._model.lora import WeightsHasher, trainable_tensors
from reprotune._run import layout
from reprotune._run.claim import unused_path
from reprotune._run.ledger import train_line, val_line
from reprotune._run.record import Status, ended_status, make_run_id, new_record, utc_now
from reprotune._run.signals import interrupt_on_signals, raise_if_interrupted, recording_the_end
from reprotune._trackers.mlflow_link import require_mlflow, run_to_link
from reprotune._trackers.wandb import import_wandb
from reprotune._train.writer import report, val_metric
from reprotune.integrations import _ranks as ranks_of
from reprotune.integrations import _sections as sections
from reprotune.integrations._findings import (
    ReproducibilityWarning,
    TrainerFacts,
    probe_seed,
    seeds_before_adapter,
    trainer_findings,
    warn_findings,
)
from reprotune.integrations._portable import portable_facts
from reprotune.integrations._probes import (
    StepProbe,
    data_sampler,
    find_trainer,
    install_probe,
    refuse_a_second,
    steps_per_epoch,
    trainer_made_adapter,
    trainer_or_refuse,
)
from reprotune.integrations._resumable import refuse_another_world_size
from reprotune.integrations._tracing import StepTrace
from reprotune.integrations._writer import (
    TrainerRun,
    abandoned,
    check_tracker_settings,
    checkpoint_run_dir,
    make_trackers,
    mark_checkpoint,
)
from reprotune.integrations.controls import Controls

__all__ = ["ReproducibilityWarning", "ReprotuneCallback"]


class ReprotuneCallback(TrainerCallback):
    """Writes a reprotune run directory from inside a ``transformers.Trainer`` (or TRL trainer).

    Give it to the trainer when it is made (``Trainer(..., callbacks=[ReprotuneCallback()])``):
    then it also checks how the PEFT model was seeded, and can resume under ``verify --command``.

    Args:
        run_dir: the run directory to write (new or empty); default ``runs/<run-id>``. On a resume
            from a checkpoint this callback saved, the run it belongs to. ``REPROTUNE_RUN_DIR``
            wins over it (``reprotune verify --command`` sets it).
        manifest: the split the data came from: a ``Manifest`` from ``reprotune.split_table`` or
            the path of a ``split.json``; copied into the run directory.
        wandb: also mirror the run to Weights & Biases (offline unless ``WANDB_MODE`` says
            otherwise; needs ``pip install 'reprotune[wandb]'``).
        wandb_project: the W&B project.
        code_dir: the directory whose git state is recorded (default: the script's directory).
        mlflow: link the MLflow run the script logs to (``report_to="mlflow"``, or its own
            ``mlflow.start_run()``): that run gets reprotune's tags and artifacts, no second run
            is made. None (default): when one is active at train begin; True: that one, or when
            none is, a run the callback starts (MLflow's tracking URI in force; it also gets
            each step's metrics); False: never.

    Raises:
        InputError: a manifest that cannot be read, W&B or MLflow asked for but not installed, or a bad
            ``REPROTUNE_*`` environment variable.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        manifest: Manifest | str | os.PathLike[str] | None = None,
        wandb: bool = False,
        wandb_project: str = "reprotune",
        code_dir: str | os.PathLike[str] | None = None,
        mlflow: bool | None = None,
    ) -> None:
        check_tracker_settings(wandb=wandb, mlflow=mlflow, wandb_project=wandb_project)
        self._controls = Controls.from_env()
        self._tracing = StepTrace(self._controls.trace_step, self._controls.trace_out)
        self._mlflow = mlflow
        self._run_dir = Path(run_dir) if run_dir is not None else None
        self._manifest = (
            load_manifest(Path(manifest)) if isinstance(manifest, str | os.PathLike) else manifest
        )
        if wandb:
            import_wandb("ReprotuneCallback(wandb=True)")
        if mlflow:
            require_mlflow("ReprotuneCallback(mlflow=True)")
        self._wandb, self._wandb_project = wandb, wandb_project
        self._code_dir = Path(code_dir) if code_dir is not None else sections.script_dir()
        # torch's RNG now, before the Trainer re-seeds it: was the PEFT model built after the seed?
        self._seed_probe = probe_seed()
        self._trainer: Any = None
        self._adapter_made_by_trainer = False
        self._checkpoint: str | None = None
        self._run: TrainerRun | None = None
        self._probe = StepProbe()
        self._hasher: WeightsHasher | None = None
        self._steps_per_epoch: int | None = None
        self._stopping = False
        self._warned = False
        self._step_started = 0.0

    # -- events ------------------------------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = find_trainer()
        if trainer is None:
            return
        refuse_a_second(trainer, type(self))
        self._trainer = trainer
        self._adapter_made_by_trainer = trainer_made_adapter(trainer)
        if self._controls.output_dir is not None:
            args.output_dir = str(self._controls.output_dir)
        self._wrap_train(trainer)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Every rank, first (a collective): who it is and, on a resume, what it will restore.
        loader = kwargs.get("train_dataloader")
        checkpoint = self._checkpoint_path(args, int(state.global_step))
        ranks = ranks_of.gather(
            lambda: ranks_of.rank_facts(args, state, loader, trainer=self._trainer, checkpoint=checkpoint)
        )
        if not state.is_world_process_zero:
            # Every rank orders its rows with its own sampler: a negative control's perturbation
            # must reach each (rank 0 only once trained ranks on other data orders than it records).
            self._controls.perturb(data_sampler(kwargs.get("train_dataloader")), report)
        # Rank 0 starts the run directory; a refusal there stops every rank.
        ranks_of.on_rank_zero(state.is_world_process_zero, self._begin, args, state, kwargs, ranks)

    def _begin(self, args: Any, state: Any, kwargs: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
        """Rank 0 at train begin: start the run directory, or continue it on a resume."""
        trainer = trainer_or_refuse(
            self._trainer, steered=bool(self._controls.resume_from or self._controls.output_dir)
        )
        refuse_a_second(trainer, type(self))  # also one added by add_callback
        retry = abandoned(self._run, trainer, fresh=not state.global_step, trainer_output=args.output_dir)
        model, loader = kwargs["model"], kwargs["train_dataloader"]
        sampler, sampler_seed = self._attach(trainer, args, state, loader)
        self._hasher = WeightsHasher(trainable_tensors(model))
        resumed_from = int(state.global_step)
        args_dict = sections.training_args(args)
        lora = sections.lora_section(model)
        model_info = sections.model_section(model, kwargs.get("processing_class"))
        config = sections.run_config(trainer, args_dict, model_info["source"], lora)
        config_sha = sections.config_sha256(config)
        eval_dataset = getattr(trainer, "eval_dataset", None)  # a resume checks its data against the start's
        data = sections.data_section(getattr(loader, "dataset", None), eval_dataset, self._manifest, None)
        findings = self._findings(args, model, loader, sampler, model_info, data)
        outputs = sections.script_outputs(args, self._controls.run_dir or self._run_dir)
        code, environment = sections.code_and_environment(self._code_dir, outputs, model)
        code_record = code.to_record(patch_file=layout.PATCH if code.diff else None)
        mlflow_run = run_to_link(self._mlflow, report)
        trackers = make_trackers(self._wandb, self._wandb_project, mlflow_run=mlflow_run)
        if resumed_from:
            run_dir = self._resume_dir(args, resumed_from)
            refuse_another_world_size(run_dir, self._checkpoint_path(args, resumed_from), len(ranks))
            self._run = TrainerRun.resume(
                run_dir,
                from_step=resumed_from,
                checkpoint=self._checkpoint_path(args, resumed_from),
                config=config,
                code=code_record,
                environment=environment,
                weights_sha256=self._hasher(),
                trackers=trackers,
                ranks=[r["restore"] for r in ranks if r["restore"] is not None],
                findings=findings,
                branch_from=self._controls.branch_from,
                trainer_output=args.output_dir,
                log_history=state.log_history,
                setup={"data": data, "model": model_info},
            )
            return
        run_id = make_run_id(config_sha)
        record = {
            **new_record(run_id, config, config_sha, sections.run_seeds(args, sampler_seed)),
            "error": None,
            "attempts": [{"started_at": utc_now(), "resumed": False}],
            "code": code_record,
            "environment": environment,
            "model": model_info,
            "lora": lora,
            "lora_defaults": sections.lora_defaults_section(model),
            "data": data,
            "trainer": sections.trainer_section(
                trainer,
                args,
                args_dict,
                int(state.max_steps),
                sampler,
                sampler_seed,
                integration=f"{__name__}.{type(self).__name__}",
                controls=self._controls,
                steps_per_epoch=self._steps_per_epoch,
                rows_recorded=self._probe.records_rows,
                ranks=[r["identity"] for r in ranks],
            ),
            "findings": findings,
        }
        self._run = TrainerRun.new(
            retry or self._controls.run_dir or self._run_dir or unused_path(Path("runs"), run_id),
            record,
            patch=code.diff,
            manifest=self._manifest,
            init_weights_sha256=self._hasher(),
            trackers=trackers,
        )

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        raise_if_interrupted()  # a signal whose exception something swallowed: stop now
        self._probe.begin_step()
        self._step_started = time.perf_counter()
        self._tracing.begin(int(state.global_step), kwargs["model"], self._hasher)  # last: the step's ops

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._tracing.next_micro_batch()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The lr this optimizer.step() uses: the scheduler steps after it.
        optimizer = kwargs.get("optimizer")
        if optimizer is not None:
            self._probe.lr = float(optimizer.param_groups[0]["lr"])
        self._tracing.optimizer()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._tracing.stop()  # first: this callback's own work is not the step's
        # On every rank: a stop on rank 0 alone left the others waiting for it forever.
        self._stopping |= self._controls.stop_here(state, control)
        if self._run is None or self._run.finished or self._hasher is None:
            return
        began = time.perf_counter()
        numbers = self._probe.end_step()
        step = int(state.global_step)
        per_epoch = self._steps_per_epoch
        epoch = (step - 1) // per_epoch if per_epoch else int(state.epoch or 0)
        weights = self._hasher()
        line = train_line(
            step, epoch, numbers.rows, numbers.n_tokens, numbers.loss, numbers.lr, numbers.grad_norm, weights
        )
        line["inputs_sha256"] = numbers.inputs_sha256
        if not self._probe.records_rows:
            line["batch_sha256"] = numbers.inputs_sha256  # no indices to hash: the rows' content
        metrics = {"train_loss": numbers.loss, "lr": numbers.lr, "grad_norm": numbers.grad_norm}
        self._run.step(step, line, metrics, began - self._step_started, began)
        self._tracing.write(step, self._run, line)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._controls.no_evaluation_inside_the_epoch(self._stopping, state, control)  # every rank

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # One val line a set the Trainer evaluates (a dict of them: each, in its order).
        found = sections.eval_loss(kwargs.get("metrics") or {}, getattr(self._trainer, "eval_dataset", None))
        if self._run is None or self._run.finished or found is None:
            return
        # The Trainer reports no token count for its mean eval loss: n_tokens is 0.
        (loss, n_rows, name), step = found, int(state.global_step)
        line = val_line(step, loss, n_rows, 0)
        self._run.validation(line, step, {val_metric(name): loss}, on_start=args.eval_on_start)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        # Every rank (a collective): its facts and the sha256 of the RNG file it just saved.
        ranks = ranks_of.gather(lambda: ranks_of.saved_state(checkpoint, args))
        if self._run is None or self._run.finished:
            return
        self._run.ledger.sync()  # every line up to the checkpoint is on disk before it is used
        if checkpoint.is_dir():
            mark_checkpoint(checkpoint, self._run, int(state.global_step), ranks)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._run is None or self._run.finished:
            return
        status: Status = "stopped" if self._stopping else "completed"
        best = state.best_model_checkpoint if args.load_best_model_at_end else None  # what it reloaded
        self._run.end(status, model=kwargs.get("model"), best_checkpoint=best)
        report(f"reprotune: run {status}: {self._run.paths.root}")

    def _wrap_train(self, trainer: Any) -> None:
        """Make ``trainer.train`` pass a verification's checkpoint to the Trainer's own resume, and
        record a run that fails as failed."""
        original = trainer.train

        def train(*args: Any, **kwargs: Any) -> Any:
            resume = self._controls.resume_from
            if resume is not None:
                args, kwargs = args[1:], {**kwargs, "resume_from_checkpoint": str(resume)}
            checkpoint = kwargs.get("resume_from_checkpoint", args[0] if args else None)
            self._checkpoint = None if checkpoint in (None, False) else str(checkpoint)
            self._stopping = False
            try:
                with interrupt_on_signals(default_only=True):  # SIGTERM/SIGHUP: recorded as Ctrl-C
                    return self._recording_the_end(original, args, kwargs)
            except Interrupted as exc:  # the handlers are back: die of the signal, as without reprotune
                os.kill(os.getpid(), exc.signum)
                raise

        trainer.train = train

    def _recording_the_end(self, original: Any, args: Any, kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except BaseException as exc:
            self._tracing.stop()
            if self._run is not None and not self._run.finished:
                status = ended_status(exc)
                try:
                    with recording_the_end():  # a launcher's stop now must not cut the record short
                        self._run.end(status, error=exc)
                except Exception as second:  # the first error is the news
                    report(f"warning: could not record the run's end: {second}")
            raise

    def _attach(self, trainer: Any, args: Any, state: Any, loader: Any) -> tuple[Any, int | None]:
        """Install the step probe; apply a negative control; return the sampler and its seed."""
        self._probe = StepProbe()
        install_probe(trainer, loader, self._probe)
        sampler = data_sampler(loader)
        sampler_seed = self._controls.perturb(sampler, report)
        self._steps_per_epoch = steps_per_epoch(loader, args.gradient_accumulation_steps)
        if state.global_step and not args.ignore_data_skip and self._steps_per_epoch:
            # The Trainer iterates the batches it skips through the recording sampler: drop them.
            skipped = state.global_step % self._steps_per_epoch
            self._probe.discard = skipped * args.gradient_accumulation_steps
        return sampler, sampler_seed

    def _findings(
        self, args: Any, model: Any, loader: Any, sampler: Any, model_info: Any, data: Any
    ) -> list[dict[str, str]]:
        facts = TrainerFacts(
            args=args,
            deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
            tf32_matmul=sections.tf32_matmul(),
            workers_seeded=getattr(loader, "worker_init_fn", None) is not None,
            seedable_sampler=isinstance(getattr(sampler, "initial_seed", None), int),
            is_peft=getattr(model, "peft_config", None) is not None,
            adapter_made_by_trainer=self._adapter_made_by_trainer,
            trainer_seeds_first=seeds_before_adapter(type(self._trainer)),
            seed_probe=self._seed_probe if self._trainer is not None else None,
            world_size=int(getattr(args, "world_size", 1)),
            rows_recorded=self._probe.records_rows,
            model_hashed=model_info.get("weights_sha256") is not None,
            data_hashed=data is None or data.get("train_rows_sha256") is not None,
            foreign_checkpoints=ranks_of.foreign_checkpoints(
                args.output_dir, self._checkpoint, self._controls.run_dir or self._run_dir
            ),
            **portable_facts(getattr(self._trainer, "optimizer", None), model),
            config_misread=sections.config_misread(model, model_info),
        )
        findings = trainer_findings(facts)
        if not self._warned:
            self._warned = True
            warn_findings(findings, stacklevel=4)  # on_train_begin, through on_rank_zero
        return findings

    def _resume_dir(self, args: Any, step: int) -> Path:
        chosen = self._controls.run_dir or self._run_dir
        return chosen if chosen is not None else checkpoint_run_dir(self._checkpoint_path(args, step), step)

    def _checkpoint_path(self, args: Any, step: int) -> str | None:
        """The checkpoint the Trainer resumes from (``resume_from_checkpoint=True``: its last)."""
        last = str(Path(args.output_dir) / f"checkpoint-{step}")
        return last if self._checkpoint == "True" else self._checkpoint
