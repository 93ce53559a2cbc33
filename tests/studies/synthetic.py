"""Study directories built from given metric values, without training (for the statistics tests).

``write_study_dir`` plans a real study of a config (``plan_study``), fills each planned run with
the given values as if it had completed, and writes ``study.json`` with the same summarising code
a real study uses (``summarise_runs``). No run directories, no torch needed to read it back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reprotune._config.loading import config_from_dict
from reprotune._studies.directory import new_study
from reprotune._studies.layout import StudyLayout
from reprotune._studies.plan import plan_study
from reprotune._studies.study import summarise_runs
from reprotune._studies.studyfile import write_study

MODEL = {"source": "tiny-model", "weights_sha256": "a" * 64, "tokenizer_sha256": "b" * 64}


def write_study_dir(
    root: Path,
    values: Sequence[float] | Mapping[str, Sequence[float]],
    *,
    vary: str = "all",
    config: Mapping[str, Any] | None = None,
    extra_metrics: Mapping[str, Sequence[float]] | None = None,
    base_model: Mapping[str, Any] | None = None,
    status: str = "completed",
    data: Mapping[str, Any] | None = None,
) -> Path:
    """A study directory whose runs measured ``values`` (per group, for ``vary="each"``)."""
    cfg = config_from_dict(dict(config or {"seed": {"root": 1}}))
    by_group = values if isinstance(values, Mapping) else {vary: values}
    n = len(next(iter(by_group.values())))
    plan = plan_study(cfg, n=n, vary=vary, name="synthetic")
    study = new_study(plan)
    runs = []
    for planned in plan.runs:
        metrics = {"final_val_loss": float(by_group[planned.group][planned.index])}
        for name, extra in (extra_metrics or {}).items():
            metrics[name] = float(extra[planned.index])
        fake = hashlib.sha256(planned.name.encode()).hexdigest()
        entry = next(e for e in study["runs"] if e["name"] == planned.name)
        runs.append(
            {
                **entry,
                "status": "completed",
                "seeds": {"root": planned.seed},
                "adapter_sha256": fake,
                "ledger_sha256": fake,
                "metrics": metrics,
            }
        )
    final = {**study, "status": status, "runs": runs, **summarise_runs(plan, runs, {})}
    final["base_model"] = dict(base_model or MODEL)
    final["data"] = dict(data) if data is not None else {"file_sha256": "d" * 64, "runs_agree": True}
    root.mkdir(parents=True, exist_ok=True)
    write_study(StudyLayout(root).study, final)
    return root
