"""The seed rule: which runs a study makes and with which seeds; the same config, the same plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprotune._config.loading import config_from_dict, dump_config_yaml, load_config
from reprotune._config.schema import config_sha256
from reprotune._determinism.seeds import derive_seed, derive_seeds
from reprotune._errors import InputError
from reprotune._studies.plan import STUDY_CONSUMERS, plan_study

CFG = config_from_dict({"seed": {"root": 11, "overrides": {"eval": 5}}})


def _seeds(run_cfg: object) -> dict[str, int]:
    seed = run_cfg.seed  # type: ignore[attr-defined]
    return derive_seeds(seed.root, dict(seed.overrides))


def test_one_consumer_moves_alone() -> None:
    """--vary data_order: run k's data-order seed is derive_seed(R, 'study/data_order/k'); every
    other seed is the config's own."""
    plan = plan_study(CFG, n=3, vary="data_order", name="cfg")
    base = _seeds(CFG)
    assert [r.name for r in plan.runs] == ["data_order-000", "data_order-001", "data_order-002"]
    for k, run in enumerate(plan.runs):
        assert run.seed == derive_seed(11, f"study/data_order/{k}")
        assert _seeds(run.config) == {**base, "data_order": run.seed}
    assert len({r.seed for r in plan.runs}) == 3


def test_all_moves_every_seed() -> None:
    """--vary all: a new root per run, overrides cleared (and said), so every consumer moves."""
    plan = plan_study(CFG, n=2, vary="all")
    a, b = (_seeds(r.config) for r in plan.runs)
    assert a["root"] == derive_seed(11, "study/root/0") and b["root"] == derive_seed(11, "study/root/1")
    assert all(a[c] != b[c] for c in ("split", "data_order", "lora_init", "dropout", "eval"))
    assert any("seed.overrides {'eval': 5} are cleared" in note for note in plan.notes)


def test_each_runs_every_consumer() -> None:
    """--vary each: N runs per consumer, in order, each moving only its own seed."""
    plan = plan_study(CFG, n=2, vary="each")
    assert plan.groups == STUDY_CONSUMERS
    assert [r.name for r in plan.runs][:3] == ["split-000", "split-001", "data_order-000"]
    base = _seeds(CFG)
    for run in plan.runs:
        moved = {k for k, v in _seeds(run.config).items() if v != base[k]}
        assert moved == {run.varied}


def test_same_config_same_plan_larger_n_keeps_runs() -> None:
    """A study is reproducible: the same config gives the same id and seeds; --n 5 keeps the first 3."""
    small, large = plan_study(CFG, n=3, vary="lora_init"), plan_study(CFG, n=5, vary="lora_init")
    assert small.study_id == large.study_id == f"study-lora_init-{config_sha256(CFG)[:8]}"
    assert [r.seed for r in small.runs] == [r.seed for r in large.runs][:3]
    other_root = plan_study(config_from_dict({"seed": {"root": 12}}), n=3, vary="lora_init")
    assert not {r.seed for r in small.runs} & {r.seed for r in other_root.runs}


def test_overrides_rebuild_the_run_config(tmp_path: Path) -> None:
    """The --set values a run gets in its own process give exactly the planned config (same hash)."""
    seed = {"root": 3, "overrides": {"dropout": 9}}
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "a", "response": "b"}\n', encoding="utf-8")
    cfg = config_from_dict({"seed": seed, "data": {"path": str(data)}})
    dump_config_yaml(cfg, tmp_path / "config.yaml")
    for vary in ("all", "dropout", "split"):
        for run in plan_study(cfg, n=2, vary=vary).runs:
            rebuilt = load_config(tmp_path / "config.yaml", run.overrides)
            assert config_sha256(rebuilt) == config_sha256(run.config)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"n": 1, "vary": "all"}, "at least 2 runs"),
        ({"n": 3, "vary": "data-order"}, "did you mean 'data_order'"),
    ],
    ids=["n1", "typo"],
)
def test_bad_plans(kwargs: dict[str, object], needle: str) -> None:
    """Too few runs or an unknown --vary: InputError naming the value and the fix."""
    with pytest.raises(InputError) as info:
        plan_study(CFG, **kwargs)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_split_from_a_manifest() -> None:
    """A split from a manifest: --vary split is refused; --vary each leaves split out and says so."""
    cfg = config_from_dict({"split": {"manifest": "/tmp/split.json"}})
    with pytest.raises(InputError, match="the split seed moves nothing"):
        plan_study(cfg, n=2, vary="split")
    plan = plan_study(cfg, n=2, vary="each")
    assert "split" not in plan.groups and any("split is not varied" in n for n in plan.notes)


def test_cli_offers_every_vary() -> None:
    """The seeds command's --vary choices are the plan's (spelled twice to keep --help light)."""
    from reprotune._cli.seeds import VARY
    from reprotune._studies.plan import VARY_CHOICES

    assert VARY == VARY_CHOICES
