"""Run directories built by hand, for the compare and report tests (no training, no torch).

``write_run_dir`` simulates a tiny training run that behaves like a real one where it matters:
seeds derived by name drive the split, the data order and the initial weights; each step's loss
and update depend on the content of the rows in its batch, so an edited row changes the numbers
from the step that first uses it; ``noise_from_step`` stands in for nondeterminism (a different
torch, thread count or GPU). The files follow docs/run-directory.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from reprotune._jsonio import canonical_dumps, sha256_bytes, sha256_file, write_json_atomic

SEED_NAMES = ("split", "data_order", "lora_init", "dropout", "eval")
WIDTH = 16  # trainable parameters in the simulated adapter


def default_rows(n: int = 24) -> list[str]:
    """``n`` distinct dataset rows."""
    return [f"prompt {i} -> response {i * 7 % 13}" for i in range(n)]


@dataclass
class RunSpec:
    """What a hand-built run is made of; change one field to make two runs differ in it."""

    seed: int = 42
    rows: list[str] = field(default_factory=default_rows)
    steps: int = 12
    batch_size: int = 2
    lr: float = 0.05
    eval_every: int = 4
    lora_r: int = 4
    model_sha256: str = hashlib.sha256(b"tiny-llama").hexdigest()
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    config: dict[str, Any] = field(default_factory=dict)  # merged into the resolved config
    environment: dict[str, Any] = field(default_factory=dict)  # merged into the environment
    model: dict[str, Any] = field(default_factory=dict)  # merged into the record's model section
    lora: dict[str, Any] = field(default_factory=dict)  # merged into the record's lora section
    lora_defaults: dict[str, Any] | None = None  # the record's lora_defaults (None: left out)
    seed_overrides: dict[str, int] = field(default_factory=dict)  # a derived seed set by hand
    noise_from_step: int | None = None  # numbers perturbed from this step on
    noise: float = 1e-6
    status: str = "completed"
    adapter_extra: int = 0  # elements of an extra adapter tensor, for benchmarks
    run_id: str = "20260101-000000-abcdef01"


def derive_seed(root: int, name: str) -> int:
    """The seed a consumer gets from the root seed, by name."""
    return int(hashlib.sha256(f"{root}:{name}".encode()).hexdigest()[:8], 16)


def seeds_of(spec: RunSpec) -> dict[str, int]:
    """The root seed and every derived seed of a run, with the spec's overrides."""
    derived = {name: derive_seed(spec.seed, name) for name in SEED_NAMES}
    return {"root": spec.seed, **derived, **spec.seed_overrides}


def row_sha256(row: str) -> str:
    """The row hash docs/manifest.md defines, for a row ``{"text": row}``."""
    canonical = json.dumps({"text": row}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def row_feature(row: str) -> float:
    """A number in [0, 1) that stands for a row's content."""
    return int(hashlib.sha256(row.encode()).hexdigest()[:8], 16) / 2**32


def make_split(spec: RunSpec) -> dict[str, list[int]]:
    """train/validation/test row indices from the split seed (4:1:1)."""
    n = len(spec.rows)
    perm = np.random.default_rng(seeds_of(spec)["split"]).permutation(n).tolist()
    n_val = n_test = n // 6
    return {
        "train": sorted(perm[n_val + n_test :]),
        "validation": sorted(perm[:n_val]),
        "test": sorted(perm[n_val : n_val + n_test]),
    }


def batches(spec: RunSpec) -> list[list[int]]:
    """The row indices of each step's batch, epoch after epoch, in the data-order seed's order."""
    train = make_split(spec)["train"]
    rng = np.random.default_rng(seeds_of(spec)["data_order"])
    order: list[int] = []
    while len(order) < spec.steps * spec.batch_size:
        order.extend(rng.permutation(train).tolist())
    return [order[i * spec.batch_size : (i + 1) * spec.batch_size] for i in range(spec.steps)]


def _hexf(x: float) -> str:
    return float(x).hex()


def _weights_sha(w: np.ndarray) -> str:
    return hashlib.sha256(w.tobytes()).hexdigest()


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def write_run_dir(path: Path, spec: RunSpec | None = None) -> Path:
    """Write a complete run directory at ``path`` for ``spec``; return ``path``."""
    spec = spec or RunSpec()
    path.mkdir(parents=True, exist_ok=True)
    split = make_split(spec)
    data_bytes = "".join(json.dumps({"text": r}) + "\n" for r in spec.rows).encode()
    n = len(spec.rows)
    # The split manifest as docs/manifest.md writes it (row hashes inline).
    manifest = {
        "schema": "reprotune/split-manifest",
        "schema_version": 1,
        "algorithm": {"name": "reprotune-split", "version": 1},
        "dataset": {
            "source": "data.jsonl",
            "format": "jsonl",
            "sha256": sha256_bytes(data_bytes),
            "n_rows": n,
            "columns": ["text"],
        },
        "seed": seeds_of(spec)["split"],
        "ratios": {"train": 4 / 6, "validation": 1 / 6, "test": 1 / 6},
        "strategy": "random",
        "stratify_by": None,
        "group_by": None,
        "rare_class_policy": "train",
        "sizes": {**{name: len(rows) for name, rows in split.items()}, "dropped": 0},
        "classes": [],
        "rare_classes": [],
        "groups": None,
        "warnings": [],
        "row_hashes": {"algorithm": "sha256", "inline": [row_sha256(r) for r in spec.rows]},
        **split,
        "dropped": [],
    }
    manifest_sha = write_json_atomic(path / "split.json", manifest)

    features = np.array([row_feature(r) for r in spec.rows])
    w = np.random.default_rng(seeds_of(spec)["lora_init"]).standard_normal(WIDTH) * 0.1
    dropout = np.random.default_rng(seeds_of(spec)["dropout"])
    lines = [{"kind": "init", "step": 0, "weights_sha256": _weights_sha(w)}]
    steps_per_epoch = len(split["train"]) // spec.batch_size
    for step, rows in enumerate(batches(spec), start=1):
        target = features[rows].mean()
        keep = dropout.random(WIDTH) > 0.1
        loss = float(np.mean(((w - target) * keep) ** 2))
        grad = 2 * (w - target) * keep / WIDTH
        w = w - spec.lr * grad
        if spec.noise_from_step is not None and step >= spec.noise_from_step:
            loss += spec.noise
            w = w + spec.noise
        lines.append(
            {
                "kind": "train",
                "step": step,
                "epoch": (step - 1) // max(steps_per_epoch, 1),
                "batch_sha256": hashlib.sha256(",".join(map(str, rows)).encode()).hexdigest(),
                "n_rows": len(rows),
                "n_tokens": 10 * len(rows),
                "loss": _hexf(loss),
                "lr": _hexf(spec.lr),
                "grad_norm": _hexf(float(np.linalg.norm(grad))),
                "weights_sha256": _weights_sha(w),
            }
        )
        if step % spec.eval_every == 0 or step == spec.steps:
            val = features[split["validation"]]
            lines.append(
                {
                    "kind": "val",
                    "step": step,
                    "loss": _hexf(float(np.mean((w.mean() - val) ** 2))),
                    "n_rows": len(val),
                    "n_tokens": 10 * len(val),
                }
            )
    ledger = "".join(canonical_dumps(line, indent=None) for line in lines).encode()
    (path / "ledger.jsonl").write_bytes(ledger)

    (path / "adapter").mkdir(exist_ok=True)
    tensors = {
        "base_model.model.layers.0.self_attn.q_proj.lora_A.weight": np.outer(
            w[: spec.lora_r], np.ones(4)
        ).astype(np.float32),
        "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": w.reshape(4, 4).astype(np.float32),
    }
    if spec.adapter_extra:
        ramp = np.arange(spec.adapter_extra, dtype=np.float64) * 1e-6
        tensors["base_model.model.extra.lora_B.weight"] = (w.mean() + ramp).astype(np.float32)
    save_file(tensors, str(path / "adapter" / "adapter_model.safetensors"))

    seeds = seeds_of(spec)
    config = _merge(
        {
            "seed": spec.seed,
            "data": {"path": "data.jsonl", "prompt_field": "text"},
            "split": {"ratios": [4, 1, 1], "strategy": "random"},
            "model": {"source": "tiny-llama"},
            "lora": {"r": spec.lora_r, "alpha": 8, "target_modules": ["q_proj"]},
            "train": {
                "lr": spec.lr,
                "batch_size": spec.batch_size,
                "max_steps": spec.steps,
                "eval_every": spec.eval_every,
            },
        },
        spec.config,
    )
    environment = _merge(
        {
            "python": {"version": "3.11.9"},
            "os": "Linux-6.1-x86_64",
            "cpu": {"model": "x86_64"},
            "torch": {
                "version": "2.13.0",
                "cuda": None,
                "cudnn": None,
                "num_threads": 2,
                "num_interop_threads": 2,
            },
            "gpus": [],
            "driver": None,
            "determinism": {"use_deterministic_algorithms": True, "cudnn_benchmark": False},
            "packages": {"numpy": "2.4.6", "peft": "0.21.2", "torch": "2.13.0", "transformers": "5.24.0"},
        },
        spec.environment,
    )
    record = {
        "schema": "reprotune/record",
        "schema_version": 1,
        "reprotune_version": "0.1.0",
        "run_id": spec.run_id,
        "status": spec.status,
        "config": config,
        "config_sha256": sha256_bytes(canonical_dumps(config).encode()),
        "seeds": seeds,
        "code": {
            "in_git": True,
            "commit": spec.commit,
            "branch": "main",
            "dirty": False,
            "diff_sha256": None,
            "patch_file": None,
            "untracked": [],
        },
        "data": {
            "source": "data.jsonl",
            "file_sha256": sha256_bytes(data_bytes),
            "n_rows": len(spec.rows),
            "manifest_sha256": manifest_sha,
            "manifest_file": "split.json",
            "split_sizes": {name: len(rows) for name, rows in split.items()},
        },
        "model": {
            "source": "tiny-llama",
            "revision": "main",
            "resolved_path": "/cache/tiny-llama",
            "weights_sha256": spec.model_sha256,
            "tokenizer_sha256": hashlib.sha256(b"bytes-tokenizer").hexdigest(),
            "dtype": "float32",
            "pad_token_id": 0,
            "max_length": 64,
            **spec.model,
        },
        "lora": {
            "r": spec.lora_r,
            "lora_alpha": 8,
            "target_modules": ["q_proj"],
            "lora_dropout": 0.1,
            **spec.lora,
        },
        "environment": environment,
        "timings": {"started_at": "2026-01-01T00:00:00Z", "duration_s": 1.5, "steps_done": spec.steps},
        "outputs": {
            "adapter_sha256": sha256_file(path / "adapter" / "adapter_model.safetensors"),
            "ledger_sha256": sha256_bytes(ledger),
        },
    }
    if spec.lora_defaults is not None:
        record["lora_defaults"] = spec.lora_defaults
    write_json_atomic(path / "record.json", record)
    return path


def edit_ledger(
    run_dir: Path, step: int, key: str, value: Any, *, kind: str = "train", as_written: bool = False
) -> None:
    """Change one value of the ``kind`` line of ``step`` by hand, keeping the line canonical;
    ``as_written``: update the record's ``outputs.ledger_sha256`` too, as if the run had written it."""
    path = run_dir / "ledger.jsonl"
    out = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if entry["kind"] == kind and entry["step"] == step:
            entry[key] = value
        out.append(canonical_dumps(entry, indent=None))
    path.write_text("".join(out))
    if as_written:
        record = json.loads((run_dir / "record.json").read_text())
        record["outputs"]["ledger_sha256"] = sha256_file(path)
        (run_dir / "record.json").write_text(canonical_dumps(record))


def truncate_ledger(run_dir: Path, drop_bytes: int) -> None:
    """Cut the last ``drop_bytes`` bytes off the ledger, as a crash mid-append would."""
    path = run_dir / "ledger.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-drop_bytes])


def two_eval_sets(
    run_dir: Path, *, first_loss_at_4: str | None = None, names: list[str] | None = None
) -> None:
    """Each val line of the run twice, as a Trainer's dict of two eval datasets writes them (the
    second set's loss its own), the first set's loss at step 4 made ``first_loss_at_4``; ``names``:
    the sets' names in the record's ``data.eval_sets``, as the callback writes them."""
    path = run_dir / "ledger.jsonl"
    out = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if entry["kind"] != "val":
            out.append(canonical_dumps(entry, indent=None))
            continue
        first = dict(entry)
        if first_loss_at_4 is not None and entry["step"] == 4:
            first["loss"] = first_loss_at_4
        second = {**entry, "loss": float.hex(float.fromhex(entry["loss"]) + 1.0)}
        out += [canonical_dumps(first, indent=None), canonical_dumps(second, indent=None)]
    path.write_text("".join(out))
    record = json.loads((run_dir / "record.json").read_text())
    record["outputs"]["ledger_sha256"] = sha256_file(path)
    if names is not None:
        record["data"]["eval_sets"] = names
    (run_dir / "record.json").write_text(canonical_dumps(record))
