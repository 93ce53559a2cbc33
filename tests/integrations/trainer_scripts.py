"""Real Trainer runs on the tiny model for the integration tests: the example scripts in fresh
processes, and a small ``transformers.Trainer`` made in the test's own process.

The example scripts are copied into the test's directory, outside any git tree: a run records the
git state of its script's directory, and the shared working tree changes while tests run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinyrun import TinyProject
from warm import run_script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: Offline, quiet, one thread: what every script run here gets.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "WANDB_MODE": "offline",
}


def as_logged(loss_hex: str) -> str:
    """The loss the Trainer logs for a step whose exact loss is ``loss_hex`` (a ledger field):
    the loss itself from transformers 5 on; 4.x logs it rounded to 4 decimals."""
    import transformers

    loss = float.fromhex(loss_hex)
    return (loss if int(transformers.__version__.split(".")[0]) >= 5 else round(loss, 4)).hex()


def length_grouped() -> dict[str, Any]:
    """TrainingArguments for a length-grouped order: transformers 5's train_sampling_strategy,
    4.x's group_by_length."""
    from transformers import TrainingArguments

    if "train_sampling_strategy" in TrainingArguments.__dataclass_fields__:
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True}


@dataclass(frozen=True)
class ScriptProject:
    """A directory with the tiny model, its data and copies of the example scripts."""

    root: Path

    @classmethod
    def create(cls, root: Path) -> ScriptProject:
        TinyProject.create(root)
        for name in ("hf_trainer.py", "trl_sft.py"):
            shutil.copy(EXAMPLES / name, root / name)
        return cls(root)

    def argv(self, script: str, *extra: str) -> list[str]:
        """The command line of an example script on the tiny model (6 steps, one thread)."""
        return [
            sys.executable,
            script,
            "--model",
            "tiny-model",
            "--data",
            "data.jsonl",
            "--max-steps",
            "6",
            "--learning-rate",
            "1e-2",
            "--threads",
            "1",
            *extra,
        ]

    def run(
        self, script: str, run_dir: str, *extra: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run an example script into ``run_dir`` in a fresh process (``env``: variables added to
        the offline ones); fail the test if it fails."""
        argv = self.argv(script, "--run-dir", run_dir, "--output-dir", f"out/{run_dir}", *extra)
        env = {**os.environ, **OFFLINE_ENV, **(env or {})}
        # A fresh process for the script, forked from the session's warm zygote (tests/warm.py).
        done = run_script(str(self.root / script), argv[2:], cwd=self.root, env=env, timeout=900)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}\n{done.stderr[-4000:]}")
        return done


def tokenized_rows(tokenizer: Any, rows: list[dict[str, str]]) -> list[dict[str, list[int]]]:
    """Prompt and response as one sequence, the loss on the response only."""
    out = []
    for row in rows:
        prompt = tokenizer(row["prompt"] + "\n", add_special_tokens=False)["input_ids"]
        response = tokenizer(row["response"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        out.append(
            {
                "input_ids": prompt + response,
                "attention_mask": [1] * (len(prompt) + len(response)),
                "labels": [-100] * len(prompt) + response,
            }
        )
    return out


def tiny_trainer(
    model_dir: Path,
    rows: list[dict[str, str]],
    output_dir: Path,
    make_callback: Callable[[], Any],
    *,
    seed: int = 0,
    seed_first: bool = True,
    eval_rows: list[dict[str, str]] | dict[str, list[dict[str, str]]] | None = None,
    **args: Any,
) -> Any:
    """A real ``transformers.Trainer`` with LoRA on the tiny model, in this process.

    ``seed_first=False`` builds the PEFT model before seeding (the mistake the callback reports).
    The callback is made where a script makes it: in the ``Trainer(...)`` call, after the model
    (``make_callback`` may return a list of them). ``eval_rows``: the Trainer's eval dataset (a
    dict: named eval datasets).
    """
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if seed_first:
        set_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(base, lora)
    if not seed_first:
        set_seed(seed)
    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": 8,
        "per_device_train_batch_size": 4,
        "learning_rate": 1e-2,
        "warmup_steps": 2,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": seed,
        "full_determinism": True,
        "use_cpu": True,
        "disable_tqdm": True,
        **args,
    }
    return Trainer(
        model=model,
        args=TrainingArguments(**settings),
        train_dataset=tokenized_rows(tokenizer, rows),
        eval_dataset=(
            {name: tokenized_rows(tokenizer, rows) for name, rows in eval_rows.items()}
            if isinstance(eval_rows, dict)
            else tokenized_rows(tokenizer, eval_rows)
            if eval_rows is not None
            else None
        ),
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
        processing_class=tokenizer,
        callbacks=made if isinstance(made := make_callback(), list) else [made],
    )
