"""The plan of a seed study: which runs, with which seeds, by a documented rule.

A study of a config with root seed ``R`` draws run ``k``'s seed (``k`` = 0, 1, ...) with the
project's one seed derivation (``_determinism.seeds.derive_seed``, sha256 of a name):

- ``--vary all``: ``seed.root = derive_seed(R, "study/root/k")`` and no ``seed.overrides``, so
  every consumer's seed moves (the eval seed too);
- ``--vary C`` (``split``, ``data_order``, ``lora_init`` or ``dropout``):
  ``seed.overrides.C = derive_seed(R, "study/C/k")``; every other seed stays as the config has it;
- ``--vary each``: the rule for one consumer, for each of them in turn (N runs each).

So a study is itself reproducible (same config, same runs), a larger ``--n`` keeps the first runs,
and a study of another root seed draws other seeds. Never imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from reprotune._config.loading import config_from_dict
from reprotune._config.schema import ExperimentConfig, config_sha256, did_you_mean
from reprotune._determinism.seeds import derive_seed
from reprotune._errors import InputError

Vary = Literal["all", "split", "data_order", "lora_init", "dropout", "each"]
VARY_CHOICES: Final[tuple[str, ...]] = get_args(Vary)
#: The consumers a study can vary on their own, in the order ``each`` runs them.
STUDY_CONSUMERS: Final[tuple[str, ...]] = ("split", "data_order", "lora_init", "dropout")
SEED_RULE: Final = (
    "run k of a study of root seed R: --vary all sets seed.root = derive_seed(R, 'study/root/k') "
    "and clears seed.overrides; --vary C sets seed.overrides.C = derive_seed(R, 'study/C/k'); "
    "--vary each applies the rule of each consumer in turn; derive_seed(root, name) = first 8 bytes "
    "of sha256('reprotune/seed/v1/<root>/<name>'), big-endian, masked to 63 bits"
)
#: The most runs per group a study plans (each is a fine-tune; the plan is held in memory).
MAX_RUNS: Final = 1000
MIN_RUNS: Final = 2


@dataclass(frozen=True)
class PlannedRun:
    """One run of a study.

    Attributes:
        name: its run directory's name, ``<group>-<k>`` (``data_order-003``, ``all-000``).
        group: what this run's group varies: ``all`` or a consumer name.
        varied: the seed that moves: ``root`` (for ``all``) or the consumer's name.
        index: ``k``, from 0.
        seed: the value the rule drew for it.
        config: the run's config (the study's config with this seed set).
    """

    name: str
    group: str
    varied: str
    index: int
    seed: int
    config: ExperimentConfig

    @property
    def overrides(self) -> list[str]:
        """``--set`` values that make the study's config into this run's config."""
        if self.varied == "root":
            return [f"seed.root={self.seed}", "seed.overrides={}"]
        return [f"seed.overrides.{self.varied}={self.seed}"]


@dataclass(frozen=True)
class StudyPlan:
    """Every run of a study, in order, and what the plan had to leave out or change."""

    study_id: str
    config: ExperimentConfig
    vary: str
    n: int
    groups: tuple[str, ...]
    runs: tuple[PlannedRun, ...]
    notes: tuple[str, ...]


def plan_study(cfg: ExperimentConfig, *, n: int, vary: str, name: str = "study") -> StudyPlan:
    """The runs of a study of ``cfg``: ``n`` per group, seeds by the rule in the module docstring.

    Args:
        cfg: the config every run starts from.
        n: runs per group (at least 2: a spread needs two values).
        vary: ``all``, one consumer (``split``, ``data_order``, ``lora_init``, ``dropout``) or ``each``.
        name: a short name for the study id (usually the config file's stem).

    Returns:
        The plan.

    Raises:
        InputError: ``n`` below 2, an unknown ``vary``, or ``--vary split`` on a config whose
            split comes from a manifest (the split seed would move nothing).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_RUNS:
        raise InputError(
            f"a study needs at least {MIN_RUNS} runs per group (got {n!r})",
            source="--n",
            fix="pass --n 5 or more for a useful spread",
        )
    if n > MAX_RUNS:
        raise InputError(
            f"--n {n} runs per group is more than a study holds (at most {MAX_RUNS}): each is a training",
            source="--n",
            fix=f"pass --n {MAX_RUNS} or fewer (5 to 20 is the useful range)",
        )
    if vary not in VARY_CHOICES:
        raise InputError(
            f"unknown --vary {vary!r}",
            source="--vary",
            fix=f"{did_you_mean(vary, VARY_CHOICES)}choose one of {', '.join(VARY_CHOICES)}",
        )
    notes: list[str] = []
    if vary == "split" and cfg.split.manifest is not None:
        raise InputError(
            "--vary split on a config whose split comes from a manifest: the split seed moves nothing",
            source=f"split.manifest ({cfg.split.manifest})",
            fix="vary another seed, or remove split.manifest so that each run makes its own split",
        )
    groups = _groups(cfg, vary, notes)
    notes.extend(_notes(cfg, vary, groups))
    runs = tuple(_planned(cfg, group, k) for group in groups for k in range(n))
    return StudyPlan(study_id(cfg, vary, name), cfg, vary, n, groups, runs, tuple(notes))


def study_id(cfg: ExperimentConfig, vary: str, name: str) -> str:
    """``<name>-<vary>-<first 8 hex of the config's sha256>``: the same config and vary, the same id."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "study"
    return f"{safe}-{vary}-{config_sha256(cfg)[:8]}"


def one_config_and_seeds(id_a: str, id_b: str) -> bool:
    """Whether two study ids are of one config and vary, so of one seeds, whatever the studies
    were named (the name is the config file's stem: a copy of it under another name is one config)."""
    return id_a.rsplit("-", 2)[1:] == id_b.rsplit("-", 2)[1:]


def _groups(cfg: ExperimentConfig, vary: str, notes: list[str]) -> tuple[str, ...]:
    if vary != "each":
        return (vary,)
    if cfg.split.manifest is not None:
        notes.append(
            "split is not varied: the config's split comes from a manifest (split.manifest), "
            "so the split seed moves nothing"
        )
        return tuple(c for c in STUDY_CONSUMERS if c != "split")
    return STUDY_CONSUMERS


def _notes(cfg: ExperimentConfig, vary: str, groups: tuple[str, ...]) -> list[str]:
    notes = []
    overrides = dict(cfg.seed.overrides)
    if vary == "all":
        if overrides:
            notes.append(f"seed.overrides {overrides} are cleared in every run: --vary all moves every seed")
        if cfg.eval.max_rows is not None:
            notes.append("the eval seed moves too: eval.max_rows samples the validation rows with it")
    for group in groups:
        if group in overrides:
            notes.append(f"seed.overrides.{group} ({overrides[group]}) is replaced by each run's seed")
    if "dropout" in groups and cfg.lora.dropout == 0:
        notes.append("lora.dropout is 0: the dropout seed moves nothing, so its runs are alike")
    return notes


def _planned(cfg: ExperimentConfig, group: str, k: int) -> PlannedRun:
    varied = "root" if group == "all" else group
    seed = derive_seed(cfg.seed.root, f"study/{varied}/{k}")
    data: dict[str, Any] = cfg.resolved()
    if varied == "root":
        data["seed"] = {"root": seed, "overrides": {}}
    else:
        data["seed"] = {**data["seed"], "overrides": {**data["seed"]["overrides"], varied: seed}}
    run_cfg = config_from_dict(data, source=f"study run {group}-{k:03d}")
    return PlannedRun(f"{group}-{k:03d}", group, varied, k, seed, run_cfg)
