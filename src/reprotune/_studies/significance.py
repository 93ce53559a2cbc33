"""``reprotune significance``: do two studies differ beyond seed noise?

The test itself (Welch's t-test, a permutation test, effect size, power) is ``_studies.twosample``;
what makes one study a sample to test is ``_studies.sample``. ``significance`` reads two
``study.json`` files, refuses what cannot be compared (exit 2), and lists what differs between
the studies' configs. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from reprotune._config.schema import did_you_mean
from reprotune._determinism.seeds import check_seed
from reprotune._errors import InputError
from reprotune._formats import SIGNIFICANCE
from reprotune._jsonio import empty_beside_keys, flattened
from reprotune._proof.inert import is_inert
from reprotune._studies.metrics import FINAL_VAL_LOSS
from reprotune._studies.plan import one_config_and_seeds
from reprotune._studies.sample import load_checked
from reprotune._studies.twosample import (
    MAX_SEEDS,
    TestResult,
    compare_samples,
    p_value,
    percent,
    verdict_line,
)


@dataclass(frozen=True)
class Significance:
    """``reprotune significance``: the two studies, the metric, the test, and what differs."""

    study_a: str
    study_b: str
    study_id_a: str
    study_id_b: str
    metric: str
    values_a: list[float]
    values_b: list[float]
    test: TestResult
    verdict: str
    differences: list[dict[str, Any]]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return SIGNIFICANCE.stamp(asdict(self))

    def format(self) -> str:
        """The verdict first, then the evidence and what differs, for people."""
        t = self.test
        level = percent(1 - t.alpha)
        perm = (
            f"exact over {t.permutation_resamples} arrangements"
            if t.permutation_exact
            else f"{t.permutation_resamples} resamples, seed {t.permutation_seed}"
        )
        welch = (
            f"t = {t.welch_t:.3f}, df = {t.welch_df:.1f}, p = {p_value(t.welch_p or 0.0, t.alpha, 3)}"
            if t.welch_t is not None
            else "not defined"
        )
        lines = [
            self.verdict,
            f"  metric              {self.metric}",
            f"  A: {self.study_a}  study {self.study_id_a}, {t.n_a} runs, "
            f"mean {t.mean_a:.6g}, sd {t.std_a:.3g}",
            f"  B: {self.study_b}  study {self.study_id_b}, {t.n_b} runs, "
            f"mean {t.mean_b:.6g}, sd {t.std_b:.3g}",
            f"  difference B - A    {t.difference:.6g} "
            + (
                f"({level} CI {t.ci_low:.6g}..{t.ci_high:.6g}, Welch)" if t.welch_t is not None else "(exact)"
            ),
            f"  Welch's t-test      {welch}",
            f"  permutation test    p = {t.permutation_p:.3g} ({perm}; smallest possible p "
            f"{t.permutation_smallest_p:.3g})",
            f"  effect size         Cohen's d = {t.cohens_d:.3g}"
            if t.cohens_d is not None
            else "  effect size         Cohen's d not defined (no spread in either study)",
            "  seeds for 80% power " + _power_text(t),
        ]
        lines += [f"  note: {note}" for note in self.notes]
        if self.differences:
            lines.append("What differs between the studies:")
            lines += [
                f"  {d['key']}: {_show(d['a'])} vs {_show(d['b'])}"
                + (" (cannot change the numbers)" if d.get("inert") else "")
                for d in self.differences
            ]
        else:
            lines.append(self.nothing_differs)
        return "\n".join(lines) + "\n"

    @property
    def nothing_differs(self) -> str:
        """The sentence said when the configs have no difference (one study: not even seeds)."""
        if one_config_and_seeds(self.study_id_a, self.study_id_b):
            return "Nothing differs between the studies' configs, not even their seeds."
        return "Nothing differs between the studies' configs but their seeds."


def _power_text(t: TestResult) -> str:
    if t.seeds_for_power is not None:
        return f"{t.seeds_for_power} per side"
    if t.cohens_d is None:
        return "not defined (no spread)"
    if t.cohens_d == 0:
        return "not defined (no difference)"
    return f"more than {MAX_SEEDS:,} per side (the effect is that small)"


def _show(value: Any) -> str:
    return "(absent)" if value is None else str(value)


def significance(
    study_a: str | Path,
    study_b: str | Path,
    *,
    metric: str = FINAL_VAL_LOSS,
    alpha: float = 0.05,
    allow_different_models: bool = False,
    seed: int = 0,
) -> Significance:
    """Test whether ``metric`` differs between two completed studies beyond seed noise.

    Args:
        study_a: study A's directory (or its study.json); the reference.
        study_b: study B's.
        metric: the metric to test (``final_val_loss`` or an eval metric both studies have).
        alpha: significance level, in (0, 0.5].
        allow_different_models: compare studies whose runs started from different base models.
        seed: the permutation test's seed, when it resamples.

    Raises:
        InputError: ``alpha`` out of range; a study unfinished, of ``--vary each``, with fewer than
            2 runs or no metric, whose study.json does not hold together, or of another base model
            or runs of different ones (without the allowance); metric sets that differ; an unknown
            metric (:func:`~reprotune._studies.sample.load_checked`).

    Example:
        >>> result = significance("studies/a", "studies/b")  # doctest: +SKIP
        >>> print(result.verdict)  # doctest: +SKIP
        B is lower than A by 0.12 (95% CI 0.07..0.17), beyond seed noise (p = 0.002, 5 seeds each)
    """
    seed = _check_options(alpha, seed)
    a = load_checked(study_a, "STUDY_A", allow_different_models=allow_different_models)
    b = load_checked(study_b, "STUDY_B", allow_different_models=allow_different_models)
    common = [m for m in a["metrics"] if m in b["metrics"]]
    if metric not in a["metrics"] and metric not in b["metrics"]:
        known = common or sorted(set(a["metrics"]) | set(b["metrics"]))
        raise InputError(
            f"no metric {metric!r} in the studies",
            source="--metric",
            fix=f"{did_you_mean(metric, known)}choose one of {', '.join(known)}",
        )
    if metric not in common:  # one study measured it: evaluate the other's runs alike
        raise InputError(
            f"the studies measured different metrics: {metric!r} is in "
            f"{'A' if metric in a['metrics'] else 'B'} only (A has {sorted(a['metrics'])}, "
            f"B has {sorted(b['metrics'])})",
            source=f"{study_a}, {study_b}",
            fix="evaluate the runs of both studies alike (reprotune eval), then rerun each `reprotune seeds` "
            f"command to refresh its study.json; or test a metric both have: {', '.join(common)}",
        )
    _refuse_other_setups(a, b, metric, (study_a, study_b))
    differences = study_differences(a, b)
    model_diffs = [d for d in differences if d["key"] in MODEL_IDENTITY]
    if model_diffs and not allow_different_models:
        shown = "; ".join(f"{d['key']} {_show(d['a'])[:16]} vs {_show(d['b'])[:16]}" for d in model_diffs)
        raise InputError(
            f"the studies' runs started from different base models ({shown})",
            source=f"{study_a}, {study_b}",
            fix="compare studies of one base model, or pass --allow if comparing base models is the point",
        )
    values_a = [float(run["metrics"][metric]) for run in a["runs"]]
    values_b = [float(run["metrics"][metric]) for run in b["runs"]]
    test = compare_samples(values_a, values_b, alpha=float(alpha), seed=seed)
    verdict = verdict_line(test)
    return Significance(
        str(study_a),
        str(study_b),
        a["study_id"],
        b["study_id"],
        metric,
        values_a,
        values_b,
        test,
        verdict,
        differences,
        _notes(a, b, test) + _one_study_note(a, b, study_a, study_b),
    )


def _refuse_other_setups(
    a: Mapping[str, Any], b: Mapping[str, Any], metric: str, paths: tuple[str | Path, str | Path]
) -> None:
    """An eval metric is one sample within a study (else left out of its summary); between two
    studies it must be measured alike too: other rows or decoding are no seed noise."""
    setup_a, setup_b = ({(run.get("metric_setups") or {}).get(metric) for run in s["runs"]} for s in (a, b))
    if None in setup_a | setup_b or setup_a == setup_b:  # no eval metric, or a study older than setups
        return
    shown_a, shown_b = (" | ".join(sorted(map(str, setups))) for setups in (setup_a, setup_b))
    raise InputError(
        f"the studies evaluated {metric!r} otherwise (A: {shown_a}; B: {shown_b})",
        source=f"{paths[0]}, {paths[1]}",
        fix="evaluate the runs of both studies alike (reprotune eval, the same split rows and "
        "generation settings), then rerun each `reprotune seeds` command to refresh its study.json",
    )


def _one_study_note(
    a: Mapping[str, Any], b: Mapping[str, Any], path_a: str | Path, path_b: str | Path
) -> list[str]:
    """A note when A and B are one study (one id: the same config, vary and seeds)."""
    if not one_config_and_seeds(a["study_id"], b["study_id"]):
        return []
    data_a, data_b = ((study.get("data") or {}).get("file_sha256") for study in (a, b))
    if data_a and data_b and data_a != data_b:
        return [
            f"A and B are studies of one config and seeds (study {a['study_id']}), but their runs trained "
            f"on different data (data.file_sha256 {data_a[:12]} vs {data_b[:12]}): a difference can come "
            "from the data"
        ]

    def folder(path: str | Path) -> Path:
        resolved = Path(path).resolve()
        return resolved.parent if resolved.is_file() else resolved

    given = (
        "one study given twice" if folder(path_a) == folder(path_b) else "two studies of one config and seeds"
    )
    return [
        f"A and B are {given} (study {a['study_id']}): a config compared with itself shows run-to-run "
        "noise at most, never a config's effect; to compare two configs, give a study of each"
    ]


def _check_options(alpha: float, seed: int) -> int:
    """Refuse an alpha outside (0, 0.5] or a seed that is no seed; return the seed as an int."""
    if not (isinstance(alpha, float | int) and 0 < alpha <= 0.5):
        raise InputError(
            f"alpha must be in (0, 0.5] (got {alpha!r})", source="--alpha", fix="e.g. --alpha 0.05"
        )
    return check_seed(seed, "the permutation test's seed", source="--seed", fix="e.g. --seed 0")


#: What makes two base models different for ``significance`` (their source, as written, does not).
MODEL_IDENTITY: Final = ("base_model.weights_sha256", "base_model.tokenizer_sha256")


def study_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What differs between two studies: config keys (as ``compare`` names them), vary, base model.

    Each difference says whether it is ``inert``: a value that cannot change the numbers (where
    the data or the model was found, as ``compare`` marks it)."""
    flat_a, flat_b = (
        {
            **flattened(study["config"]),
            "study.vary": study["vary"],
            # whether its runs agree is the study's own matter (load_checked), not a difference
            **flattened(
                {k: v for k, v in (study.get("base_model") or {}).items() if k != "runs_agree"}, "base_model"
            ),
            **flattened(study.get("data") or {}, "study.data"),  # config keys have no prefix
        }
        for study in (a, b)
    )
    # Where the data and the model were found cannot change the numbers only when what was found
    # is compared by its hash: a study without the data's (written before it was kept) has none.
    hashed = {
        "data.path": all((s.get("data") or {}).get("file_sha256") for s in (a, b)),
        "model.name": all((s.get("base_model") or {}).get("weights_sha256") for s in (a, b)),
    }
    return [
        {"key": key, "a": flat_a.get(key), "b": flat_b.get(key), "inert": _inert(key, hashed)}
        for key in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(key) != flat_b.get(key) and not empty_beside_keys(key, flat_a, flat_b)
    ]


def _inert(key: str, hashed: Mapping[str, bool]) -> bool:
    if key.startswith("base_model."):
        return key not in MODEL_IDENTITY
    if key.startswith("study.") or not hashed.get(key, True):
        return False
    return is_inert(f"config.{key}")


#: A study whose runs disagree on what they started from (compared with ``--allow``, for a model).
_MIXED: Final = {
    "data": "train on the same data (the data file changed while it was made): its spread mixes data "
    "with seed noise",
    "base_model": "start from the same base model files (the model changed while it was made): its "
    "spread mixes models with seed noise",
}


def _notes(a: Mapping[str, Any], b: Mapping[str, Any], t: TestResult) -> list[str]:
    notes = [t.note] if t.note else []
    if (t.permutation_p < t.alpha) != t.beyond_noise:
        if t.permutation_smallest_p >= t.alpha:
            notes.append(
                f"the permutation test gives p = {t.permutation_p:.3g}: with {t.n_a} and {t.n_b} seeds its "
                f"smallest possible p is {t.permutation_smallest_p:.3g}, so it cannot confirm "
                f"at alpha {t.alpha:g}"
            )
        else:
            notes.append(f"the permutation test disagrees with Welch's t-test (p = {t.permutation_p:.3g})")
    for label, study in (("A", a), ("B", b)):
        for key, said in _MIXED.items():
            if (study.get(key) or {}).get("runs_agree") is False:
                notes.append(f"study {label}'s runs did not all {said}")
        if study["vary"] != "all":
            notes.append(
                f"study {label} moves only the {study['vary']} seed: the other seeds stay at one value, "
                "so its spread leaves their noise out and a difference can come from them; "
                "compare configs with studies made with --vary all"
            )
    if a["vary"] != b["vary"]:
        notes.append(
            f"the studies vary different seeds ({a['vary']} vs {b['vary']}): "
            "their seed noise is not of the same kind"
        )
    return notes
