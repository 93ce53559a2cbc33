"""One eval's life: :func:`run_eval`.

1. check the run, its adapter, data and rows (``_eval.inputs``), before anything heavy;
2. set the run's determinism flags and thread count, load the base model and the adapter,
   verified against the record (``_eval.model``);
3. encode each row's prompt exactly as training did (a prompt too long is cut from its start, as
   in training: the rows cut are counted, recorded and said), generate batch-invariantly
   (``_eval.decode``), score (``_eval.metrics``);
4. write ``predictions.jsonl`` and ``eval.json`` into a temporary directory beside the target and
   rename it into place: an eval directory is complete or absent. A default name (no ``--out``)
   taken by another eval of the same identity in the same second gets a suffix (``-2``, ``-3``...).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._determinism.device import resolve_device
from reprotune._determinism.flags import apply_determinism
from reprotune._errors import InputError
from reprotune._eval.decode import Generated, generate_rows
from reprotune._eval.evalfile import ids_sha256, predictions_bytes
from reprotune._eval.inputs import EvalInputs, EvalRow, prepare_inputs
from reprotune._eval.layout import (
    PREDICTIONS,
    evals_dir,
    new_eval_id,
    publish_eval_dir,
    refuse_unwritable_evals_dir,
)
from reprotune._eval.metrics import Scores, score_rows
from reprotune._eval.model import EvalModel, load_eval_model
from reprotune._eval.prompts import encode_prompt, prompt_truncation
from reprotune._eval.settings import (
    GenerationSettings,
    generation_identity,
    identity_sha256,
)
from reprotune._formats import EVAL
from reprotune._jsonio import canonical_sha256, sha256_bytes
from reprotune._run import layout as run_layout
from reprotune._run.fingerprint import environment_fingerprint
from reprotune._run.layout import RunLayout
from reprotune._run.outputs import refuse_inside_run, refuse_unwritable_parent
from reprotune._run.record import utc_now
from reprotune._train.hooks import hf_progress_bars
from reprotune._version import __version__


@dataclass(frozen=True)
class EvalResult:
    """What :func:`run_eval` wrote.

    Attributes:
        eval_dir: the complete eval directory.
        record: its ``eval.json``.
        metrics: the corpus metrics (``record["metrics"]``).
        predictions_sha256: sha256 of ``predictions.jsonl``.
    """

    eval_dir: Path
    record: dict[str, Any]
    metrics: dict[str, float]
    predictions_sha256: str


def run_eval(
    run_dir: str | Path,
    *,
    split: str = "test",
    max_rows: int | None = None,
    batch_size: int | None = None,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    base_only: bool = False,
    allow_tokenizer_change: bool = False,
    report: Callable[[str], None] | None = None,
) -> EvalResult:
    """Evaluate the run in ``run_dir`` on a split of its own manifest; write an eval directory.

    Args:
        run_dir: a completed run directory (any run with ``base_only``).
        split: ``test`` (default) or ``validation``.
        max_rows: evaluate N rows of the split, drawn with the eval seed and kept in manifest
            order (``_eval.inputs.sample_rows``); None: ``eval.generate_max_rows`` (null: all).
        batch_size: rows per generation batch; None: ``eval.generate_batch_size``. On CPU in
            float32 the predictions do not depend on it.
        overrides: ``eval.KEY=VALUE`` / ``seed.KEY=VALUE`` changes to the run's config.
        out: the eval directory to create (must not exist); default ``RUN_DIR/evals/<eval-id>``.
        base_only: evaluate the base model without the adapter.
        allow_tokenizer_change: go on (and say so in the record) when the tokenizer files differ
            from those the run recorded.
        report: called with progress lines and warnings (prompts cut to fit); None is silent.

    Returns:
        The eval directory, its record and metrics.

    Raises:
        InputError: bad input (see ``prepare_inputs`` and ``load_eval_model``), ``out`` exists,
            ``out`` (or, without it, ``RUN_DIR/evals``) cannot be written, or a bad
            ``batch_size``. Nothing is written then.

    Example:
        >>> result = run_eval("runs/A", max_rows=32)  # doctest: +SKIP
        >>> result.metrics["bleu"]  # doctest: +SKIP
        12.5
    """
    started, created_at = time.perf_counter(), utc_now()
    inputs = prepare_inputs(
        Path(run_dir), split=split, max_rows=max_rows, overrides=overrides, base_only=base_only
    )
    cfg = inputs.cfg
    size, target = _checked_size_and_target(batch_size, out, cfg.eval.generate_batch_size)
    _refuse_unwritable(target, inputs.run_dir)
    device = resolve_device(cfg.determinism.device)
    flags = apply_determinism(
        cfg.determinism.mode, cfg.determinism.threads, device.type, cpu_isa=cfg.determinism.cpu_isa
    )
    with hf_progress_bars(report is not None):
        loaded = load_eval_model(
            cfg,
            inputs.record.get("model") or {},
            inputs.adapter_dir,
            device=str(device),
            allow_tokenizer_change=allow_tokenizer_change,
            record_path=RunLayout(inputs.run_dir).record,
        )
    settings = GenerationSettings.from_config(cfg, inputs.seeds)
    encoded = [encode_prompt(loaded.tokenizer, row, inputs.cfg) for row in inputs.rows]
    prompts = [prompt.ids for prompt in encoded]
    truncation = prompt_truncation(encoded, inputs.cfg.model.max_length, report)
    t0 = time.perf_counter()
    generated = _generate(loaded, inputs, prompts, settings, size, report)
    generate_s = time.perf_counter() - t0
    texts = [_text(loaded.tokenizer, g, loaded.eos_token_ids) for g in generated]
    scores = score_rows(texts, [row.reference for row in inputs.rows], [len(g.ids) for g in generated])
    lines = _prediction_lines(inputs.rows, prompts, generated, texts, scores)
    data = predictions_bytes(lines)
    generation = _generation_section(settings, loaded, inputs, size, str(device), flags)
    generation["prompt_truncation"] = truncation
    record = _record(inputs, loaded, generation, scores, data, flags)
    _identify_and_time(record, inputs.split, created_at, started, generate_s, generated)
    final = target if target is not None else evals_dir(inputs.run_dir) / record["eval_id"]
    final = publish_eval_dir(final, data, record, unique=target is None)
    return EvalResult(final, record, dict(scores.metrics), sha256_bytes(data))


def _refuse_unwritable(target: Path | None, run_dir: Path) -> None:
    """``--out`` inside a run is refused; without it, the run's ``evals/`` must be writable."""
    if target is not None:
        refuse_inside_run(target, option="--out", own=evals_dir(run_dir))
    else:
        refuse_unwritable_evals_dir(run_dir)


def _identify_and_time(
    record: dict[str, Any],
    split: str,
    created_at: str,
    started: float,
    generate_s: float,
    generated: Sequence[Generated],
) -> None:
    """The record's identity, eval id, creation time and timings."""
    record["identity_sha256"] = identity_sha256(_identity(record))
    record["eval_id"] = new_eval_id(split, record["identity_sha256"])
    record["created_at"] = created_at
    tokens = sum(len(g.ids) for g in generated)
    record["timings"] = {
        "duration_s": time.perf_counter() - started,
        "generate_s": generate_s,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / generate_s if generate_s > 0 else None,
    }


def _checked_size_and_target(
    batch_size: int | None, out: str | Path | None, configured: int
) -> tuple[int, Path | None]:
    """The batch size to use and the eval directory asked for, refused before anything loads."""
    size = batch_size if batch_size is not None else configured
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(
            f"batch size must be a whole number >= 1 (got {size!r})", source="--batch-size", fix="use e.g. 8"
        )
    target = Path(out) if out is not None else None
    if target is not None and (target.exists() or target.is_symlink()):
        raise InputError(
            f"{target} already exists", source="--out", fix="choose a new directory: an eval never overwrites"
        )
    if target is not None:
        refuse_unwritable_parent(target, source="--out")
    return size, target


def _generate(
    loaded: EvalModel,
    inputs: EvalInputs,
    prompts: Sequence[Sequence[int]],
    settings: GenerationSettings,
    size: int,
    report: Callable[[str], None] | None,
) -> list[Generated]:
    say = report or (lambda line: None)
    return generate_rows(
        loaded.model,
        prompts,
        [row.index for row in inputs.rows],
        settings,
        batch_size=size,
        eos_token_ids=loaded.eos_token_ids,
        pad_token_id=int(loaded.info["pad_token_id"]),
        on_batch=lambda done, total: say(f"eval: {done}/{total} rows"),
    )


def _text(tokenizer: Any, generated: Generated, eos: Sequence[int]) -> str:
    ids = generated.ids[:-1] if generated.stopped_at_eos and generated.ids[-1] in eos else generated.ids
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def _prediction_lines(
    rows: Sequence[EvalRow],
    prompts: Sequence[Sequence[int]],
    generated: Sequence[Generated],
    texts: Sequence[str],
    scores: Scores,
) -> list[dict[str, Any]]:
    return [
        {
            "index": row.index,
            "row_sha256": row.sha256,
            "prompt_ids_sha256": ids_sha256(prompt),
            "prompt_tokens": len(prompt),
            "output_ids": list(g.ids),
            "output_ids_sha256": ids_sha256(g.ids),
            "stopped_at_eos": g.stopped_at_eos,
            "text": text,
            "scores": row_scores,
        }
        for row, prompt, g, text, row_scores in zip(rows, prompts, generated, texts, scores.rows, strict=True)
    ]


def _generation_section(
    settings: GenerationSettings,
    loaded: EvalModel,
    inputs: EvalInputs,
    batch_size: int,
    device: str,
    flags: dict[str, Any],
) -> dict[str, Any]:
    cfg = inputs.cfg
    chat = bool(getattr(loaded.tokenizer, "chat_template", None))
    plan = loaded.invariance.plan
    return {
        **settings.to_json(),
        "eos_token_ids": list(loaded.eos_token_ids),
        "pad_token_id": int(loaded.info["pad_token_id"]),
        "stop": "at the first eos token (kept in output_ids, not in text)",
        "prompt": {
            "format": "chat_template" if chat else "prompt_template",
            "prompt_template": None if chat else cfg.data.prompt_template,
            "system_prompt": cfg.data.system_prompt,
            "max_length": cfg.model.max_length,
            "truncation": "prompt cut from its start to fit model.max_length, as in training",
        },
        "dtype": cfg.model.dtype,
        "device": device,
        "threads": flags.get("torch_num_threads"),
        "attention": loaded.attention,
        "gemm_blocks": plan.blocks if plan is not None else None,
        "merged_adapter": False,
        "batch_size": batch_size,
        "batch_invariant": loaded.invariance.shown,
        "invariance": loaded.invariance.to_json(),
    }


def _record(
    inputs: EvalInputs,
    loaded: EvalModel,
    generation: dict[str, Any],
    scores: Scores,
    predictions: bytes,
    flags: dict[str, Any],
) -> dict[str, Any]:
    info = loaded.info
    rows = [{"index": row.index, "sha256": row.sha256} for row in inputs.rows]
    adapter = None
    if inputs.adapter_files is not None:
        adapter = {
            "sha256": inputs.adapter_files.get(run_layout.ADAPTER_WEIGHTS),
            "files": dict(inputs.adapter_files),
            "merged": False,
        }
    return EVAL.stamp(
        {
            "reprotune_version": __version__,
            "status": "completed",
            "run": {
                "run_id": inputs.run_id,
                "run_dir": str(inputs.run_dir.resolve()),
                "config_sha256": inputs.record.get("config_sha256"),
            },
            "base_only": inputs.adapter_dir is None,
            "adapter": adapter,
            "model": {
                key: info.get(key)
                for key in (
                    "source",
                    "revision",
                    "weights_sha256",
                    "config_sha256",
                    "tokenizer_sha256",
                    "dtype",
                )
            },
            "tokenizer": {**loaded.tokenizer_check, "files": info.get("tokenizer_files")},
            "data": {**inputs.data, "manifest_sha256": inputs.manifest_sha256},
            "split": {
                "name": inputs.split,
                "split_rows": inputs.split_size,
                "n_rows": len(rows),
                "rows_sha256": canonical_sha256(rows),
                "rows": rows,
                "sample": dict(inputs.sample) if inputs.sample is not None else None,
            },
            "generation": generation,
            "metrics": dict(scores.metrics),
            "metric_config": scores.config,
            "predictions": {
                "file": PREDICTIONS,
                "sha256": sha256_bytes(predictions),
                "n_rows": len(rows),
            },
            "determinism": flags,
            "environment": environment_fingerprint(attention=loaded.attention),
        }
    )


def _identity(record: dict[str, Any]) -> dict[str, Any]:
    """What decides an eval's outputs: model, adapter, tokenizer, rows, generation settings."""
    return {
        "model": {k: record["model"].get(k) for k in ("weights_sha256", "config_sha256", "tokenizer_sha256")},
        "adapter": (record["adapter"] or {}).get("sha256"),
        "rows_sha256": record["split"]["rows_sha256"],
        "generation": generation_identity(record["generation"]),
    }
