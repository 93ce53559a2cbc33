"""The optimizer each mode builds, and learning-rate schedules."""

from __future__ import annotations

import pytest
import torch

from reprotune._config.schema import TrainConfig
from reprotune._train.optim import lr_factor, optimizer_and_scheduler


@pytest.mark.parametrize(
    ("cpu_isa", "optimizer", "fused"),
    [
        ("native", "adamw", False),
        ("avx2-amd", "adamw", False),
        ("avx2-compatible", "adamw", True),
        ("avx2-compatible", "sgd", False),
    ],
)
def test_adamw_runs_fused_only_where_the_cpu_isa_mode_needs_it(
    cpu_isa: str, optimizer: str, fused: bool
) -> None:
    """avx2-compatible: AdamW fused (ATen's own square root, not MKL's rsqrtps kernel); every other
    mode: the for-loop form, one tensor at a time, as every run before; SGD takes no square root."""
    params = [torch.nn.Parameter(torch.ones(3))]
    train = TrainConfig(optimizer=optimizer)  # type: ignore[arg-type]
    built, _ = optimizer_and_scheduler(params, train, 10, cpu_isa=cpu_isa)
    assert bool(built.defaults["fused"]) is fused
    assert built.defaults["foreach"] is (None if fused else False)  # the for-loop form: one tensor at a time


@pytest.mark.parametrize(
    ("schedule", "step", "expected"),
    [
        ("constant", 0, 0.5),  # warmup: (0 + 1) / 2
        ("constant", 9, 1.0),
        ("linear", 2, 1.0),  # first step after warmup
        ("linear", 7, 0.375),  # (7 - 2) / 8 of the way down
        ("linear", 10, 0.0),
        ("cosine", 6, 0.5),  # half way: cos(pi / 2) = 0
    ],
    ids=["const-0", "const-9", "linear-start", "linear-mid", "linear-end", "cosine-mid"],
)
def test_schedules(schedule: str, step: int, expected: float) -> None:
    """Each schedule after a 2-step warmup over 10 steps."""
    assert lr_factor(step, schedule=schedule, warmup_steps=2, total_steps=10) == pytest.approx(
        expected, abs=1e-12
    )


def test_warmup_is_linear() -> None:
    """Warmup ramps up to the base rate."""
    assert [lr_factor(s, schedule="linear", warmup_steps=4, total_steps=10) for s in range(4)] == [
        0.25,
        0.5,
        0.75,
        1.0,
    ]


def test_a_native_config_in_the_cross_vendor_modes_variables_fuses_adamw_as_the_record_says() -> None:
    """Started with avx2-compatible's variables, a native config's run is recorded in that mode
    (read back as in force): its AdamW runs fused too, as the mode needs (before: unfused, so the
    record claimed a mode whose promise across vendors did not hold)."""
    import json
    import os
    import subprocess
    import sys

    from reprotune._determinism.isa import BASELINES

    code = (
        "import json, torch; from reprotune._config.schema import TrainConfig; "
        "from reprotune._determinism.isa import isa_in_force; "
        "from reprotune._train.optim import optimizer_and_scheduler as build; "
        "o, _ = build([torch.nn.Parameter(torch.ones(3))], TrainConfig(), 10, cpu_isa='native'); "
        "print(json.dumps([isa_in_force()['cpu_isa'], bool(o.defaults['fused'])]))"
    )
    env = {**os.environ, **BASELINES["avx2-compatible"].env}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["avx2-compatible", True]
