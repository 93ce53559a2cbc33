"""Crash injection: SIGKILL a real run at many points; the run directory must stay readable, and
``reprotune resume`` must finish it bitwise IDENTICAL to an uninterrupted run.

The run: the tiny model, 8 steps, checkpoints every 2 steps (at 2, 4, 6; none at the last step),
keep 2, validation at 4 and 8, LoRA dropout 0.1 (so a lost RNG state would show). What the run
does, in order, with the kill point each moment is reached by (``REPROTUNE_KILL_AT=<point>:<n>``,
tests/inject/injected_faults.py)::

    record.json #1 (replace:record.json:1), split.json, record.json #2, ledger init line (ledger-append:1)
    step 1 (ledger-append:2, step-end:1)
    step 2 (ledger-append:3), checkpoint 2 (checkpoint-file:1-5), step-end:2
    step 3 (ledger-append:4, step-end:3)
    step 4 (ledger-append:5), val 4 (ledger-append:6), checkpoint 4 (checkpoint-file:6-10), step-end:4
    step 5 (ledger-append:7, step-end:5)
    step 6 (ledger-append:8), checkpoint 6 (checkpoint-file:11-15, then checkpoint 2 is pruned)
    step 7, step 8 (ledger-append:10), val 8 (ledger-append:11), step-end:8
    adapter, record.json #3 (completed), record.json #4 (with the trackers' outcome)

The five ``checkpoint-file`` boundaries of a checkpoint: after trainable.safetensors, after
optimizer.pt, after rng.safetensors + rng.json, after state.json, after the rename.

Each kill costs two fresh processes (the killed run and the resume, ~5 s each), so the points are
chosen to cover each kind of moment once rather than every step: ~20 points, about 3-4 minutes.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from reprotune._jsonio import sha256_file
from reprotune._proof.compare import compare_runs
from reprotune._run.checkpoint import list_checkpoints, verify_checkpoint
from reprotune._run.layout import LEDGER as LEDGER_FILE
from reprotune._run.ledger import read_ledger
from reprotune._run.record import load_record
from tinyrun import TinyProject

pytestmark = pytest.mark.slow

QUIET = ("--no-progress", "--no-tracking")
ADAPTER = Path("adapter") / "adapter_model.safetensors"
CRASH_TRAIN = {"max_steps": 8, "save_every": 2, "keep_checkpoints": 2, "eval_every": 4}

Outcome = Literal["resume", "complete", "rerun"]


@dataclass(frozen=True)
class KillPoint:
    """One place to kill the run, and how it must be recovered.

    Attributes:
        spec: the ``REPROTUNE_KILL_AT`` value.
        resume_from: the checkpoint step resume must start from (0: none valid, start over).
        outcome: ``resume``: ``reprotune resume`` finishes it; ``complete``: the completed record had
            already landed, so resume refuses (exit 2) and the run is whole; ``rerun``: no record
            had landed (nothing was trained), so ``reprotune run`` into the same directory starts it.
        why: the moment, for the reader.
    """

    spec: str
    resume_from: int
    why: str
    outcome: Outcome = "resume"


KILL_POINTS = [
    KillPoint("replace:record.json:1", 0, "first record written to a temp file, not renamed", "rerun"),
    KillPoint("replace:split.json:1", 0, "split manifest not yet in place"),
    KillPoint("replace:record.json:2", 0, "second record write, before the ledger exists"),
    KillPoint("ledger-append:1", 0, "half of the init line written"),
    KillPoint("step-end:1", 0, "after step 1, no checkpoint yet"),
    KillPoint("checkpoint-file:1", 0, "first checkpoint: only trainable.safetensors in its temp dir"),
    KillPoint("checkpoint-file:5", 2, "first checkpoint renamed, nothing after it"),
    KillPoint("step-end:2", 2, "checkpoint 2 renamed, before step 3's ledger line"),
    KillPoint("ledger-append:4", 2, "half of step 3's ledger line"),
    KillPoint("ledger-append:6", 2, "half of the validation line of step 4"),
    KillPoint("checkpoint-file:6", 2, "checkpoint 4: after trainable.safetensors"),
    KillPoint("checkpoint-file:7", 2, "checkpoint 4: after optimizer.pt"),
    KillPoint("checkpoint-file:8", 2, "checkpoint 4: after rng.safetensors and rng.json"),
    KillPoint("checkpoint-file:9", 2, "checkpoint 4: after state.json, before the rename"),
    KillPoint("checkpoint-file:10", 4, "checkpoint 4: after the rename"),
    KillPoint("step-end:5", 4, "between steps, past the validation line of step 4"),
    KillPoint("checkpoint-file:15", 6, "checkpoint 6 renamed, checkpoint 2 not yet pruned"),
    KillPoint("step-end:8", 6, "every step done, before the adapter is saved"),
    KillPoint("ledger-append:11", 6, "half of the final validation line"),
    KillPoint("replace:record.json:3", 6, "adapter saved, the completed record not yet renamed"),
    KillPoint("replace:record.json:4", 6, "completed record in place; its trackers update not", "complete"),
]

_tried: list[str] = []
_recovered: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _kill_point_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """After the module, print how many kill points were tried and recovered (shown without ``-s``)."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or not _tried:
        return
    line = (
        f"crash test: {len(_tried)} kill points tried, {len(_recovered)} recovered IDENTICAL "
        f"({', '.join(_tried)})"
    )
    if capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_line(line)
    else:
        reporter.write_line(line)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    """The tiny project for this module."""
    return TinyProject.create(tmp_path_factory.mktemp("crash-project"))


@pytest.fixture(scope="module")
def config(project: TinyProject) -> Path:
    """The crash-test config: 8 steps, checkpoints at 2, 4 and 6."""
    return project.config("crash.yaml", train=CRASH_TRAIN)


@pytest.fixture(scope="module")
def reference(project: TinyProject, config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run every crashed run must end up identical to."""
    run_dir = tmp_path_factory.mktemp("crash-runs") / "reference"
    project.run_cli("run", str(config), "--run-dir", str(run_dir), *QUIET)
    assert load_record(run_dir / "record.json")["status"] == "completed"
    return run_dir


def _assert_readable(run_dir: Path) -> None:
    """Every file reads; the record loads; the ledger reads (a partial last line repaired); every
    renamed checkpoint is whole (half-written ones may only exist as hidden temporary directories)."""
    for path in run_dir.rglob("*"):
        if path.is_file():
            path.read_bytes()
            if path.suffix == ".json" and not path.name.startswith("."):
                json.loads(path.read_text(encoding="utf-8"))
    if (run_dir / "record.json").exists():
        assert load_record(run_dir / "record.json")["status"] in {"running", "completed"}
    if (run_dir / LEDGER_FILE).exists():
        read_ledger(run_dir / LEDGER_FILE, repair=True)
    for checkpoint in list_checkpoints(run_dir / "checkpoints"):
        assert verify_checkpoint(checkpoint) is None, checkpoint


def _assert_identical(reference: Path, run_dir: Path) -> None:
    """compare says IDENTICAL (strict reader: no partial line), and ledger and adapter bytes are equal."""
    assert str(compare_runs(reference, run_dir).verdict) == "IDENTICAL"
    assert (run_dir / LEDGER_FILE).read_bytes() == (reference / LEDGER_FILE).read_bytes()
    assert sha256_file(run_dir / ADAPTER) == sha256_file(reference / ADAPTER)
    assert load_record(run_dir / "record.json")["status"] == "completed"


@pytest.mark.parametrize(
    "point",
    [pytest.param(p, id=p.spec) for p in KILL_POINTS],
)
def test_kill_then_recover_is_identical(
    project: TinyProject, config: Path, reference: Path, tmp_path: Path, point: KillPoint
) -> None:
    """SIGKILL at this point leaves a readable run dir; recovery finishes it IDENTICAL to the reference."""
    _tried.append(point.spec)
    run_dir = tmp_path / "run"
    killed = project.run_cli(
        "run",
        str(config),
        "--run-dir",
        str(run_dir),
        *QUIET,
        env={"REPROTUNE_KILL_AT": point.spec},
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, f"the kill point never fired:\n{killed.stderr[-2000:]}"
    _assert_readable(run_dir)

    if point.outcome == "complete":
        refused = project.run_cli("resume", str(run_dir), *QUIET, check=False)
        assert refused.returncode == 2 and "already complete" in refused.stderr
    elif point.outcome == "rerun":
        assert not (run_dir / "record.json").exists()
        refused = project.run_cli("resume", str(run_dir), *QUIET, check=False)
        assert refused.returncode == 2 and "reprotune run" in refused.stderr
        project.run_cli("run", str(config), "--run-dir", str(run_dir), *QUIET)
    else:
        assert load_record(run_dir / "record.json")["status"] == "running"
        resumed = project.run_cli("resume", str(run_dir), *QUIET)
        if point.resume_from:
            assert f"from step {point.resume_from} (step-{point.resume_from:08d})" in resumed.stderr
        else:
            assert "resuming" not in resumed.stderr  # no valid checkpoint: started over
        attempts = load_record(run_dir / "record.json")["attempts"]
        assert [a["resumed"] for a in attempts] == [False, True]
    _assert_readable(run_dir)
    _assert_identical(reference, run_dir)
    hidden = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    assert hidden == [], "a later checkpoint sweeps what the killed one left"
    _recovered.append(point.spec)


def test_enough_kill_points_cover_every_kind() -> None:
    """The list covers every kind of kill point and each file boundary of one checkpoint."""
    specs = [p.spec for p in KILL_POINTS]
    assert len(specs) == len(set(specs)) >= 15
    kinds = {s.rsplit(":", 1)[0] for s in specs}
    assert {"step-end", "ledger-append", "checkpoint-file", "replace:record.json"} <= kinds
    assert {f"checkpoint-file:{n}" for n in range(6, 11)} <= set(specs)


def test_corrupt_newest_checkpoint_falls_back_with_a_warning(
    project: TinyProject, config: Path, reference: Path, tmp_path: Path
) -> None:
    """A byte flipped in the newest checkpoint: resume warns on stderr, uses the previous one, IDENTICAL."""
    run_dir = tmp_path / "run"
    project.run_cli("run", str(config), "--run-dir", str(run_dir), "--stop-after-step", "6", *QUIET)
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["step-00000004", "step-00000006"]
    newest = run_dir / "checkpoints" / "step-00000006"
    data = bytearray((newest / "trainable.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x01
    (newest / "trainable.safetensors").write_bytes(bytes(data))

    resumed = project.run_cli("resume", str(run_dir), *QUIET)
    assert (
        f"warning: checkpoint {newest} is refused: trainable.safetensors does not match its recorded "
        "sha256; falling back to the previous one"
    ) in resumed.stderr
    assert "from step 4 (step-00000004)" in resumed.stderr
    _assert_identical(reference, run_dir)


def test_no_valid_checkpoint_starts_over_identical(
    project: TinyProject, config: Path, reference: Path, tmp_path: Path
) -> None:
    """Every checkpoint damaged: resume warns for each, starts over from step 0, and still ends IDENTICAL."""
    run_dir = tmp_path / "run"
    project.run_cli("run", str(config), "--run-dir", str(run_dir), "--stop-after-step", "5", *QUIET)
    for checkpoint in list_checkpoints(run_dir / "checkpoints"):
        (checkpoint / "rng.json").write_text("{}", encoding="utf-8")
    resumed = project.run_cli("resume", str(run_dir), *QUIET)
    assert resumed.stderr.count("rng.json does not match its recorded sha256") == 2
    assert "resuming" not in resumed.stderr
    _assert_identical(reference, run_dir)
