"""LoRA fine-tuning with a plain ``transformers.Trainer``, recorded by reprotune.

A script like the ones people already have; the lines marked ``# reprotune`` are all it takes to
get reprotune's run directory (record, exact per-step ledger, adapter), so that
``reprotune compare``, ``report`` and ``verify --command`` work on its runs. Runs offline on the
embedded SmolLM2-135M-Instruct and chatterbot corpus by default:

    python examples/hf_trainer.py --max-steps 20
    reprotune verify --command "python examples/hf_trainer.py --max-steps 20" --resume-at 10

``--model`` takes a local model directory (or a hub id in the local cache), ``--data`` a JSONL file
with ``prompt``, ``response`` and ``category`` columns.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

import reprotune  # reprotune
from reprotune.integrations.transformers import ReprotuneCallback  # reprotune


def parse_args() -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--data", default="builtin:chatterbot-en")
    parser.add_argument("--output-dir", default="out/hf_trainer")
    parser.add_argument("--run-dir", default=None, help="reprotune run directory (default runs/<run-id>)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument(
        "--save-steps", type=int, default=0, help="save a Trainer checkpoint every N steps (0: none)"
    )
    parser.add_argument("--eval-rows", type=int, default=32, help="validation rows evaluated at the end")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--wandb", action="store_true", help="also mirror the run to W&B (offline)")
    parser.add_argument(
        "--mlflow",
        action="store_true",
        help="mirror the run to MLflow even when the Trainer does not report there",
    )
    parser.add_argument("--report-to", default="none", help="the Trainer's own reporting, e.g. mlflow")
    return parser.parse_args()


def tokenize(rows: list[dict[str, Any]], tokenizer: Any, max_length: int) -> list[dict[str, list[int]]]:
    """Prompt and response as one sequence; the loss covers the response only (prompt labels -100)."""
    examples = []
    for row in rows:
        prompt = tokenizer(row["prompt"] + "\n", add_special_tokens=False)["input_ids"]
        response = tokenizer(row["response"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        ids = (prompt + response)[:max_length]
        labels = ([-100] * len(prompt) + response)[:max_length]
        examples.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels})
    return examples


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    reprotune.seed_everything(args.seed)  # reprotune: before the model and its LoRA are built

    # The data, split once and for all: the manifest holds the exact rows of each split.
    table = reprotune.load_table(args.data)
    manifest = reprotune.split_table(table, seed=args.split_seed, stratify_by="category")
    splits = reprotune.materialize(manifest, table)

    # reprotune's loader finds the embedded model (or a local directory, or the local HF cache).
    loaded = reprotune.load_base_model(
        args.model, revision=None, dtype="float32", pad_token_id=None, padding_side="right", device="cpu"
    )
    tokenizer = loaded.tokenizer
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(loaded.model, lora)

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=2,
        logging_steps=args.logging_steps,
        eval_strategy="steps",
        eval_steps=args.max_steps,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to=args.report_to,
        seed=args.seed,
        full_determinism=True,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=tokenize(splits["train"], tokenizer, args.max_length),
        eval_dataset=tokenize(splits["validation"][: args.eval_rows], tokenizer, args.max_length),
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
        processing_class=tokenizer,
        callbacks=[
            ReprotuneCallback(args.run_dir, manifest=manifest, wandb=args.wandb, mlflow=args.mlflow or None)
        ],  # reprotune
    )
    trainer.train()


if __name__ == "__main__":
    main()
