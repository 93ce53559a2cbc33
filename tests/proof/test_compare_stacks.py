"""``compare`` of two runs made on two library stacks (records written by hand, tests/rundirs.py):
the libraries that compute a step named first, the base model's buffers as a cause of their own,
and what one library version writes that the other lacks kept out of the causes. The same on
real stacks: tests/proof/test_cross_stack.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import peft

from reprotune._model.lora import lora_defaults
from reprotune._proof.compare import compare_runs
from reprotune._proof.differences import Verdict
from rundirs import RunSpec, write_run_dir

LOCK = {"transformers": "5.24.0", "peft": "0.21.2", "accelerate": "1.15.0", "python-dateutil": "2.9.0"}
FLOOR = {"transformers": "4.56.0", "peft": "0.17.0", "accelerate": "1.10.0", "python-dateutil": "4.0.0"}


def _stack(distributions: dict[str, str], executable: str) -> dict[str, Any]:
    return {"distributions": distributions, "python": {"version": "3.11.9", "executable": executable}}


def test_the_libraries_that_compute_the_step_are_the_cause_and_the_trace_follows(tmp_path: Path) -> None:
    """Two stacks part at step 3: the cause names transformers, PEFT and accelerate first (not
    python-dateutil, nor the interpreter's path, which cannot change a number), and compare prints
    the trace commands that find where their code paths part."""
    a = write_run_dir(tmp_path / "lock", RunSpec(environment=_stack(LOCK, "/a/.venv/bin/python")))
    b = write_run_dir(
        tmp_path / "floor",
        RunSpec(environment=_stack(FLOOR, "/a/.venv-floor/bin/python"), noise_from_step=3),
    )
    result = compare_runs(a, b)
    assert result.causes == (
        "numbers differ from step 3 with identical data order: the libraries that compute the step "
        "differ: transformers 5.24.0 vs 4.56.0; peft 0.21.2 vs 0.17.0; accelerate 1.15.0 vs 1.10.0 "
        "(and 1 more environment differences)",
    )
    inert = {d.key for d in result.differences if d.inert}
    assert "environment.python.executable" in inert
    # Both may be on one machine: each command is headed by the libraries it must trace with.
    assert result.next_steps[:4] == (
        "in A's environment (x86_64; transformers 5.24.0, peft 0.21.2, accelerate 1.15.0):",
        f"  reprotune trace {a} --step 3 --out A-step-3.trace.jsonl",
        "in B's environment (x86_64; transformers 4.56.0, peft 0.17.0, accelerate 1.10.0):",
        f"  reprotune trace {b} --step 3 --out B-step-3.trace.jsonl",
    )


def test_lora_fields_one_peft_version_lacks_are_listed_and_inert(tmp_path: Path) -> None:
    """Fields a newer PEFT writes and an older one does not have, unset (null, false, empty), and
    the PEFT version its config carries, cannot change a number: listed, never a cause. A field
    one side lacks while the other sets it can."""
    newer = {"use_bdlora": None, "ensure_weight_tying": False, "alpha_pattern": {}, "peft_version": "0.21.2"}
    a = write_run_dir(tmp_path / "new", RunSpec(lora=newer))
    b = write_run_dir(tmp_path / "old", RunSpec())
    result = compare_runs(a, b)
    assert result.verdict is Verdict.IDENTICAL
    assert {d.key: d.inert for d in result.differences} == {
        "lora.alpha_pattern": True,
        "lora.ensure_weight_tying": True,
        "lora.peft_version": True,
        "lora.use_bdlora": True,
    }
    on = write_run_dir(tmp_path / "on", RunSpec(lora={"use_dora": True}, noise_from_step=2))
    assert [(d.key, d.inert) for d in compare_runs(b, on).differences] == [("lora.use_dora", False)]


def test_a_field_one_peft_lacks_is_inert_where_it_holds_its_peft_default(tmp_path: Path) -> None:
    """A field an older PEFT lacks, written by the newer one with a default that is not null
    (``qalora_group_size: 16``): the record's ``lora_defaults`` (this PEFT's own, from its
    ``LoraConfig``) show it is the feature off, so it is listed and inert. Set to anything else,
    it is a LoRA difference; in a record without the defaults, 16 is not known to be off."""
    defaults = lora_defaults(peft.LoraConfig())
    assert defaults["qalora_group_size"] == 16 and defaults["use_qalora"] is False
    newer = {"qalora_group_size": 16, "use_qalora": False}
    old = write_run_dir(tmp_path / "old", RunSpec())
    at_default = write_run_dir(tmp_path / "default", RunSpec(lora=newer, lora_defaults=defaults))
    result = compare_runs(old, at_default)
    assert result.verdict is Verdict.IDENTICAL
    assert {d.key: d.inert for d in result.differences} == {
        "lora.qalora_group_size": True,
        "lora.use_qalora": True,
    }
    changed = {**newer, "qalora_group_size": 32}
    other = write_run_dir(
        tmp_path / "other", RunSpec(lora=changed, lora_defaults=defaults, noise_from_step=2)
    )
    assert {d.key: d.inert for d in compare_runs(old, other).differences} == {
        "lora.qalora_group_size": False,
        "lora.use_qalora": True,
    }
    unknown = write_run_dir(tmp_path / "unknown", RunSpec(lora=newer, noise_from_step=2))
    assert {d.key: d.inert for d in compare_runs(unknown, old).differences} == {
        "lora.qalora_group_size": False,
        "lora.use_qalora": True,
    }


def test_buffers_the_config_made_at_load_are_a_model_cause(tmp_path: Path) -> None:
    """The same config files, read by two transformers versions into other rotary frequencies:
    the buffer is the first cause, with the versions that read the files; a record made before
    reprotune hashed buffers is no difference."""
    buffers_a = {
        "buffers": {"model.rotary_emb.inv_freq": "1" * 64, "model.rotary_emb.original_inv_freq": "3" * 64}
    }
    buffers_b = {"buffers": {"model.rotary_emb.inv_freq": "2" * 64}}
    a = write_run_dir(tmp_path / "a", RunSpec(model=buffers_a, environment=_stack(LOCK, "/p")))
    spec_b = RunSpec(model=buffers_b, environment=_stack(FLOOR, "/p"), noise_from_step=1)
    b = write_run_dir(tmp_path / "b", spec_b)
    causes = compare_runs(a, b).causes
    assert causes[0] == (
        "numbers differ from step 1 with identical data order: a buffer the base model computed from "
        "its config at load differs (with equal config files: transformers 5.24.0 vs 4.56.0 read them "
        "otherwise): model.rotary_emb.inv_freq 111111111111 vs 222222222222; "
        "model.rotary_emb.original_inv_freq 333333333333 vs (absent)"
    )
    assert causes[1].startswith("numbers differ from step 1 with identical data order: the libraries that")
    assert any(line.startswith("  reprotune trace ") for line in compare_runs(a, b).next_steps)
    older = write_run_dir(tmp_path / "older", RunSpec(environment=_stack(LOCK, "/p")))
    assert compare_runs(a, older).differences == ()
    none = write_run_dir(tmp_path / "none", RunSpec(model={"buffers": {}}, environment=_stack(LOCK, "/p")))
    assert compare_runs(none, older).differences == ()  # a model without buffers, against an old record


def test_torch_gpu_and_thread_facts_are_said_beside_the_libraries(tmp_path: Path) -> None:
    """A library difference does not hide a thread count that differs too."""
    a = write_run_dir(tmp_path / "a", RunSpec(environment=_stack(LOCK, "/p")))
    threads = {**_stack({**LOCK, "numpy": "1.26.4"}, "/p"), "threads": {"torch_intra_op": 8}}
    b = write_run_dir(tmp_path / "b", RunSpec(environment=threads, noise_from_step=2))
    assert compare_runs(a, b).causes == (
        "numbers differ from step 2 with identical data order: the libraries that compute the step "
        "differ: numpy (absent) vs 1.26.4; and threads.torch_intra_op (absent) vs 8",
    )
