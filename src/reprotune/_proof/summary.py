"""The first screen of a report on a proof: what was proven, on which machine, at what cost.

``reprotune report`` accepts, besides run directories, a verification directory (``reprotune
verify --out``, holding ``verification.json``) or a bundle rerun directory (``reprotune rerun
BUNDLE --out``, holding ``rerun.json``). Each stands for its runs (the reference first), and its
summary opens the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._documents import read_json_file
from reprotune._formats import BUNDLE_RERUN, COMMAND_VERIFICATION
from reprotune._formats import VERIFICATION as VERIFICATION_FORMAT
from reprotune._html import badge, escape, table
from reprotune._proof.proof_files import checked_bundle_rerun, checked_verification
from reprotune._run.layout import VERIFICATION, RunLayout

RERUN_SUMMARY = "rerun.json"
TRAINER_CHECKPOINTS = "the Trainer's own checkpoints"


@dataclass(frozen=True)
class LegView:
    """A verification's leg as the report shows it: its name, what it must be, the verdict verify
    gave it (its end state judged too, where compare over the common steps does not), and whether
    it is a negative control or a replay of an interval (a spot check's)."""

    name: str
    expected: str
    verdict: str | None
    replay: bool


@dataclass(frozen=True)
class Proof:
    """A verification or a bundle rerun: its runs (reference first), whether each is compared with
    the reference over the steps both hold only (a control that stops once it parts, by design;
    a spot check's replay, which holds the steps to its interval's end), each leg as verify
    judged it (None: the reference, a bundle's runs), and its summary as HTML."""

    runs: list[Path]
    prefix: list[bool]
    html: str
    legs: list[LegView | None]


@dataclass(frozen=True)
class Expanded:
    """The runs a report's arguments stand for, and what it says of them."""

    runs: list[Path]
    prefix: list[bool]
    legs: list[LegView | None]
    summaries: list[str]


def expand(paths: Sequence[Path]) -> Expanded:
    """The run directories ``paths`` stand for, whether each is to be compared over the common
    steps only (verify's fast controls, a spot check's replays), each as verify judged it, and
    the proof summaries to open the report with."""
    out = Expanded([], [], [], [])
    for path in paths:
        proof = _proof(Path(path))
        if proof is None:
            out.runs.append(Path(path))
            out.prefix.append(False)
            out.legs.append(None)
        else:
            out.runs.extend(proof.runs)
            out.prefix.extend(proof.prefix)
            out.legs.extend(proof.legs)
            out.summaries.append(proof.html)
    return out


def _proof(path: Path) -> Proof | None:
    if (path / VERIFICATION).is_file():
        return _verification(path, _read_verification(path / VERIFICATION))
    if (path / RERUN_SUMMARY).is_file():
        fix = "pass a directory written by `reprotune rerun BUNDLE --out`, whole"
        source = str(path / RERUN_SUMMARY)
        data = BUNDLE_RERUN.check(
            read_json_file(source, what="bundle rerun summary", fix=fix), source=source, fix=fix
        )
        return _bundle_rerun(path, checked_bundle_rerun(data, source=source, fix=fix))
    return None


def _read_verification(file: Path) -> dict[str, Any]:
    """``verification.json`` of ``verify`` or of ``verify --command``, of any version this reads.

    Raises:
        InputError: not JSON (with line and column), or a field the report reads of another type.
        SchemaVersionError: neither format, or a version this reprotune does not read.
    """
    fix = "pass a directory written by `reprotune verify --out`, whole"
    data = read_json_file(file, what="verification", fix=fix)
    form = COMMAND_VERIFICATION if COMMAND_VERIFICATION.holds(data) else VERIFICATION_FORMAT
    return checked_verification(form.check(data, source=str(file), fix=fix), source=str(file), fix=fix)


def _verification(path: Path, data: dict[str, Any]) -> Proof:
    taken: set[Path] = set()
    data = {
        **data,
        "legs": [{**leg, "run_dir": _here(path, leg.get("run_dir"), taken)} for leg in data.get("legs", [])],
    }
    legs = [leg for leg in data["legs"] if _compared(leg)]
    reference = Path(_here(path, data.get("reference"), taken) or path / "reference")
    verdict = str(data.get("verdict"))
    rows = [
        (
            str(leg["name"]),
            str(leg.get("verdict")),
            str(leg.get("expected")),
            _mark(leg.get("passed")),
            round(float(leg["wall_s"]), 1) if leg.get("wall_s") else "-",  # spot: one process for all
            str(leg.get("note") or ""),
        )
        for leg in data.get("legs", [])
    ]
    css = "IDENTICAL" if verdict == "PASS" else "DIVERGED"
    proven = _command_proven(data) if COMMAND_VERIFICATION.holds(data) else _config_proven(data)
    html = f"<h2>What was proven</h2><p>{badge(css, f'verify {verdict}')} {proven}" + table(
        ("leg", "verdict", "must be", "ok", "seconds", "note"), rows
    )
    # Before schema 4 the flag was not written: the fast mode's controls were compared so.
    fast = data.get("mode") == "fast"
    # A spot check's legs hold the steps up to their interval's end (older files said prefix false).
    spot_mode = data.get("mode") == "spot"
    prefix = [
        spot_mode or bool(leg.get("prefix", fast and str(leg.get("name")).startswith("control")))
        for leg in legs
    ]
    views: list[LegView | None] = [
        LegView(
            str(leg["name"]),
            str(leg.get("expected")),
            leg.get("verdict"),
            spot_mode and leg.get("expected") != "DIVERGED",
        )
        for leg in legs
    ]
    return Proof([reference, *(Path(leg["run_dir"]) for leg in legs)], [False, *prefix], html, [None, *views])


def _here(directory: Path, recorded: Any, taken: set[Path]) -> Any:
    """A run a verification names, inside ``directory`` as it is now: the recorded path's tail
    there when that holds a run no other leg took (the paths were recorded where the verification
    was made, or relative to where it ran: it may since have been moved or copied), else as
    recorded (a ``--reference`` run outside it, or a leg that left no run)."""
    if not isinstance(recorded, str) or not recorded:
        return recorded
    parts = Path(recorded).parts
    for k in range(1, min(len(parts), 3) + 1):  # the name; its parent and name (recorded/run)...
        here = directory / Path(*parts[-k:])
        if here not in taken and RunLayout(here).is_run_dir():
            taken.add(here)
            return str(here)
    return recorded


def _compared(leg: dict[str, Any]) -> bool:
    """Whether the report compares the leg's run with the reference: a leg that ran and was
    judged; not one that failed or was not run (its directory may hold no run, or half of one)."""
    run_dir, verdict = leg.get("run_dir"), leg.get("verdict")
    return bool(run_dir) and verdict not in (None, "FAILED") and RunLayout(Path(str(run_dir))).is_run_dir()


def _sampled(spot: dict[str, Any], origin: str) -> str:
    return (
        f"{spot.get('intervals_replayed')} of {spot.get('intervals_available')} intervals "
        f"({spot.get('steps_replayed')} of {spot.get('total_steps')} steps), replayed from {origin}, "
        "gave bit-identical ledger lines and end states"
    )


def _config_proven(data: dict[str, Any]) -> str:
    """What ``verify`` of a config proved (from the legs that passed), its machine and its cost,
    as HTML."""
    verdict, spot = str(data.get("verdict")), data.get("spot") or {}
    if verdict != "PASS":
        proven = "The config did NOT verify: see the legs below, and each leg's comparison further down."
    elif data.get("mode") == "spot":
        proven = (
            f"The recorded run reproduces where it was sampled: {_sampled(spot, 'its own checkpoints')}, "
            "and the negative controls show the check can fail."
        )
    else:
        proven = f"The config reproduces: {_reproduced(data.get('legs') or [])}."
    mode = f"{data['mode']} mode, " if data.get("mode") else ""
    return (
        f"({escape(mode)}config sha256 <code>{escape(str(data.get('config_sha256', ''))[:12])}</code>). "
        f"{escape(proven)}</p>" + _machine_and_cost(data)
    )


def _reproduced(legs: list[dict[str, Any]]) -> str:
    """What the legs of a passing verify showed: a rerun, a resume only where one was checked
    (not with --no-resume, nor without a checkpoint before the end), the controls where they ran."""
    passed = {str(leg.get("name")) for leg in legs if leg.get("passed") is True}
    same = "gave bit-identical losses and weights"
    if "rerun-resume" in passed:
        shown = f"a rerun (stopped at a checkpoint and resumed in a fresh process) {same}"
    else:
        shown = f"a rerun in a fresh process {same}"
        if "resume" in passed:
            shown += ", and so did a run stopped at a checkpoint and resumed"
        else:
            skipped = next((leg.get("note") for leg in legs if leg.get("name") == "resume"), None)
            shown += f" (exact resume was not checked: {skipped or 'verify ran with --no-resume'})"
    if "eval" in passed:
        shown += "; the end-of-run evaluation was bit-identical too"
    if any(name.startswith("control") for name in passed):
        shown += ", and the negative controls show the check can fail"
    return shown


def _machine_and_cost(data: dict[str, Any]) -> str:
    """Where a verification ran and what it cost against its reference run, as HTML (the cost
    only where the file records it: schema 1 did not)."""
    cost, spent = data.get("cost"), data.get("wall_s") or data.get("legs_s")
    machine = f"<p>Machine: {escape(_machine(data.get('machine') or {}))}."
    if not isinstance(spent, int | float):
        return machine + "</p>"
    return (
        f"{machine} Cost: {float(spent):.0f} s of legs for a {float(data.get('reference_s') or 0):.0f} s "
        f"run{f' ({cost:.2f}x)' if isinstance(cost, (int, float)) else ''}.</p>"
    )


def _command_proven(data: dict[str, Any]) -> str:
    """What ``verify --command`` proved of a user's Trainer script, as HTML."""
    verdict, spot, resume_at = str(data.get("verdict")), data.get("spot"), data.get("resume_at")
    if verdict != "PASS":
        proven = "The command did NOT verify: see the legs below, and each leg's comparison further down."
    elif spot:
        proven = (
            f"The command's run reproduces where it was sampled: "
            f"{_sampled(spot, TRAINER_CHECKPOINTS)}, and the data-order "
            "control shows the check can fail."
        )
    else:
        resumed = (
            f"; stopped after step {resume_at} and resumed with the Trainer's own "
            "resume_from_checkpoint, it gave them too"
            if resume_at is not None
            else ""
        )
        proven = (
            "The command reproduces: run again in a fresh process it gave bit-identical losses and "
            f"weights{resumed}, and the data-order control shows the check can fail."
        )
    shown = f"(command <code>{escape(str(data.get('command')))}</code>). {escape(proven)}</p>"
    return shown + (_machine_and_cost(data) if "machine" in data else "")  # schema 3 on


def _bundle_rerun(path: Path, data: dict[str, Any]) -> Proof:
    verdict = str(data.get("verdict"))
    largest = data.get("largest_loss_difference")
    environment = [str(key) for key in data.get("environment_differences", [])]
    html = (
        f"<h2>What was proven</h2><p>{badge(verdict, verdict)} "
        f"rerun of bundle <code>{escape(str(data.get('bundle')))}</code> (sha256 "
        f"<code>{escape(str(data.get('bundle_sha256', ''))[:12])}</code>) on {escape(str(data.get('host')))}"
        f" in {float(data.get('seconds') or 0):.0f} s"
        + (f", tolerance {data['tolerance']:g}" if data.get("tolerance") is not None else "")
        + (f", largest loss difference {largest:.3g}" if isinstance(largest, (int, float)) else "")
        + ".</p>"
        + "".join(f"<p>{escape(str(cause))}</p>" for cause in data.get("causes", []))
        + f"<p>Environment differences: {escape(', '.join(environment) or 'none')}.</p>"
        + _code_drift(data)
    )
    return Proof([path / "recorded" / "run", path / "rerun"], [False, False], html, [None, None])


def _code_drift(data: dict[str, Any]) -> str:
    """What code the rerun ran that was not the run's, where ``--allow-code-drift`` let it."""
    if not data.get("code_drift_allowed"):
        return ""
    lines = [str(line) for line in data.get("code_drift", [])]
    return (
        "<p>The code here was not the run's (let through by <code>--allow-code-drift</code>): "
        + (escape("; ".join(lines)) if lines else "none differed")
        + ".</p>"
    )


def _mark(passed: Any) -> str:
    return "yes" if passed else ("n/a" if passed is None else "NO")


def _machine(machine: dict[str, Any]) -> str:
    keys = ("host", "platform", "processor", "cpu_count", "python")
    return ", ".join(f"{k} {machine[k]}" for k in keys if machine.get(k) is not None) or "not recorded"
