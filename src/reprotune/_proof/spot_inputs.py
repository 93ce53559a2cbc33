"""What ``verify --spot`` checks of a run before it replays anything (``_proof.spot``), besides
what ``rerun`` checks (data, code, environment): that the base model it was made from is found
here, and that its ledger and adapter are the files its record hashed.

A model that is not here is bad input, refused before anything is written: every interval loads
it in the replay process, which would otherwise fail after the plan and its log were written (the
usual case for a bundle on another machine, whose base model stays where it was packed). A ledger
or adapter file that is not the recorded one fails the check, as a damaged checkpoint does: the
replays are judged against those very files, and an edit of a ledger line outside the intervals
drawn, or of the adapter itself, would otherwise pass unseen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reprotune._errors import InputError
from reprotune._model.loading import resolve_source
from reprotune._proof.bundle import output_problems
from reprotune._proof.verification import Leg
from reprotune._run.layout import RunLayout
from reprotune._run.record import read_record, record_config


def check_base_model(record: Mapping[str, Any], run_dir: Path) -> None:
    """Refuse the run in ``run_dir`` when its base model, as its recorded config names it (resolved
    here as a replay resolves it), is not found here.

    Raises:
        InputError: naming the model, where the run loaded it from, and how to make it found.
    """
    source = str(RunLayout(run_dir).record)
    model = record_config(record, run_dir=run_dir, source=source).resolve_paths().model
    try:
        resolve_source(model.name, model.revision)
    except InputError as exc:
        raise InputError(
            f"the run's base model is not here: {exc.message}",
            source=f"{source} (key config.model.name)",
            fix=_model_fix(model.name, record.get("model") or {}) or exc.fix,
        ) from None


def _model_fix(name: str, recorded: Mapping[str, Any]) -> str | None:
    """How to make the run's model found here: a local directory copied to where the run found it
    (the record's config resolves its name there again), a hub model put in the local cache at the
    recorded commit; None for another kind (a builtin's own fix says what to install)."""
    weights = recorded.get("weights_sha256")
    which = f" (the record's model.weights_sha256 is {weights})" if weights else ""
    where, revision = recorded.get("resolved_path") or recorded.get("source"), recorded.get("revision")
    if recorded.get("kind") == "local" and where:
        return f"copy the base model the run was made from{which} to {where}, where the run loaded it"
    if recorded.get("kind") == "hub":
        at = f" --revision {revision}" if revision else ""
        return (
            f"put the model in the local Hugging Face cache (`hf download {name}{at}` where there is "
            f"network, then copy the cache here), or set HF_HUB_CACHE to a cache that holds it{which}"
        )
    return None


def run_file_legs(run_dir: Path, progress: Callable[[str], None]) -> list[Leg]:
    """A failed leg for each ledger or adapter file of the run in ``run_dir`` that is missing or
    not the one its record hashed (``_proof.bundle.output_problems``), said as it is found."""
    paths = RunLayout(run_dir)
    legs = []
    for path, problem in output_problems(paths, read_record(paths.record)):
        name = path.relative_to(run_dir).as_posix()
        progress(f"warning: {path} {problem}")
        note = f"{name} {problem}: the run does not hold what its record says it made"
        legs.append(Leg(f"run file {name}", "", "IDENTICAL", passed=False, note=note))
    return legs
