"""``verify``'s eval leg: when the config evaluates its runs (``eval.generate_at_end``), the eval
of the reference and the eval of the rerun leg, each made in its own fresh process, must be
IDENTICAL row for row (every generated token id).

Both evals come from ``reprotune run``/``resume`` itself (``generate_at_end``); a ``--reference``
run without one made like the rerun's (none, or only evals of other rows, seeds or splits) is
evaluated here first, in a fresh process. Controls are not evaluated:
they stop as soon as they have parted (fast mode).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from reprotune._errors import ReprotuneError
from reprotune._eval.compare import EvalVerdict, compare_evals, latest_pairs
from reprotune._eval.layout import run_evals
from reprotune._proof.verification import Leg

EVAL_LEG = "eval"


def eval_leg(reference: Path, rerun: Path, run: Callable[..., float], progress: Callable[[str], None]) -> Leg:
    """Judge the evals of ``reference`` and ``rerun`` (run directories); ``run(*args)`` runs
    ``reprotune ARGS`` in a fresh process and returns its wall time. The leg has no run directory
    of its own: the evals are the runs'."""
    wall = [0.0]
    try:
        return _judged(reference, rerun, run, progress, wall)
    except ReprotuneError as exc:  # a failed eval, or a damaged one (a --reference run's): the
        # leg fails, in a verification that still ends
        note = exc.message + (f" ({exc.source})" if exc.source else "")
        return Leg(EVAL_LEG, "", "IDENTICAL", verdict="FAILED", passed=False, note=note, wall_s=wall[0])


def _judged(
    reference: Path,
    rerun: Path,
    run: Callable[..., float],
    progress: Callable[[str], None],
    wall: list[float],
) -> Leg:
    """:func:`eval_leg`, its processes' wall time added to ``wall[0]`` as they end."""
    # The rerun leg's evals are its own run's (generate_at_end); the reference needs one made
    # alike: a --reference run may hold only others (fewer rows, another seed, the validation split)
    pairs = latest_pairs(reference, rerun)
    for run_dir in (rerun, reference):
        if pairs or (run_dir == rerun and run_evals(rerun)):
            continue
        progress(f"verify: eval of {run_dir} in a fresh process")
        wall[0] += run("eval", str(run_dir), "--no-progress")
        pairs = latest_pairs(reference, rerun)
    wall_s = wall[0]
    if not pairs:
        why = "the two runs have no evals made with the same settings to compare"
        return Leg(EVAL_LEG, "", "IDENTICAL", passed=False, note=why, wall_s=wall_s)
    verdicts: list[EvalVerdict] = []
    evidence: dict[str, Any] = {}
    note: str | None = None
    for a, b in pairs:
        cmp = compare_evals(a, b)
        verdicts.append(cmp.verdict)
        evidence[b.name] = {"a": str(a), "rows": cmp.rows_compared, "rows_differing": len(cmp.rows_differing)}
        if cmp.verdict != "IDENTICAL" and note is None:
            note = f"eval {b.name}: " + (cmp.causes[0] if cmp.causes else cmp.verdict)
    verdict: EvalVerdict = next((v for v in verdicts if v != "IDENTICAL"), "IDENTICAL")
    progress(f"  {EVAL_LEG}: {verdict} (must be IDENTICAL)")
    return Leg(
        EVAL_LEG,
        "",
        "IDENTICAL",
        verdict=verdict,
        passed=verdict == "IDENTICAL",
        evidence=evidence,
        note=note,
        wall_s=wall_s,
    )
