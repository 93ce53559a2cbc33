"""LoRA supervised fine-tuning with TRL's ``SFTTrainer``, recorded by reprotune.

The lines marked ``# reprotune`` are all it takes to get reprotune's run directory (record, exact
per-step ledger, adapter). Runs offline on the embedded SmolLM2-135M-Instruct and chatterbot corpus
by default; set ``HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1`` so that TRL does not look anything
up on the network:

    HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 python examples/trl_sft.py --max-steps 20
    reprotune verify --command "python examples/trl_sft.py --max-steps 20" --resume-at 10

``--model`` takes a local model directory (or a hub id in the local cache), ``--data`` a JSONL file
with ``prompt``, ``response`` and ``category`` columns.
"""

from __future__ import annotations

import argparse

import torch
from datasets import Dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

import reprotune  # reprotune
from reprotune.integrations.transformers import ReprotuneCallback  # reprotune


def parse_args() -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--data", default="builtin:chatterbot-en")
    parser.add_argument("--output-dir", default="out/trl_sft")
    parser.add_argument("--run-dir", default=None, help="reprotune run directory (default runs/<run-id>)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument(
        "--save-steps", type=int, default=0, help="save a Trainer checkpoint every N steps (0: none)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--wandb", action="store_true", help="also mirror the run to W&B (offline)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    reprotune.seed_everything(args.seed)  # reprotune: before the model is built

    # The data, split once and for all: the manifest holds the exact rows of each split.
    table = reprotune.load_table(args.data)
    manifest = reprotune.split_table(table, seed=args.split_seed, stratify_by="category")
    rows = reprotune.materialize(manifest, table)["train"]
    train = Dataset.from_list([{"prompt": r["prompt"] + "\n", "completion": r["response"]} for r in rows])

    # reprotune's loader finds the embedded model (or a local directory, or the local HF cache).
    loaded = reprotune.load_base_model(
        args.model, revision=None, dtype="float32", pad_token_id=None, padding_side="right", device="cpu"
    )
    config = SFTConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_steps=2,
        logging_steps=args.logging_steps,
        max_length=args.max_length,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to="none",
        seed=args.seed,
        full_determinism=True,
        use_cpu=True,
        disable_tqdm=True,
        dataset_num_proc=None,
    )
    trainer = SFTTrainer(
        model=loaded.model,
        args=config,
        train_dataset=train,
        processing_class=loaded.tokenizer,
        peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]),
        callbacks=[ReprotuneCallback(args.run_dir, manifest=manifest, wandb=args.wandb)],  # reprotune
    )
    trainer.train()


if __name__ == "__main__":
    main()
