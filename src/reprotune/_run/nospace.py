"""A full disk during a run: the error that names the path, the space, and how to go on.

Whatever wrote when the disk filled (the ledger, a checkpoint, the record, the adapter), the run
stops with one message: where, how much is free, and that ``reprotune resume`` continues the run
once space is freed (the run is recorded as failed, with this error, where the record still fits).
"""

from __future__ import annotations

from pathlib import Path

from reprotune._errors import NoSpaceError
from reprotune._jsonio import free_bytes, human_bytes, is_no_space
from reprotune._run.layout import RunLayout


def no_space_in_run(exc: BaseException, run_dir: Path, *, recorded: bool = True) -> NoSpaceError | None:
    """A full disk during a run, as the error that names it and says how to go on (else None).
    ``recorded``: this attempt's record is on disk (it is then ended as failed); when not, the
    run's record, if it has one, is as the attempt before left it."""
    if isinstance(exc, KeyboardInterrupt):
        return None
    # torch.save says only "file write failed": a device with next to nothing free explains it.
    nearly_full = (
        isinstance(exc, RuntimeError) and "write" in str(exc) and (free_bytes(run_dir) or 0) < 1 << 20
    )
    if not (isinstance(exc, NoSpaceError) or is_no_space(exc) or nearly_full):
        return None
    where = exc.source if isinstance(exc, NoSpaceError) and exc.source else str(run_dir)
    message = exc.message if isinstance(exc, NoSpaceError) else f"no space left on the device of {where}"
    free = free_bytes(run_dir)
    have = f" ({human_bytes(free)} free)" if free is not None and "free" not in message else ""
    if recorded or RunLayout(run_dir).record.is_file():
        said = "the run stopped and is recorded as failed" if recorded else "the run's record is as it was"
        return NoSpaceError(
            f"{message}{have}; {said}",
            source=where,
            fix=f"free space on that device (a checkpoint of this run is about the size of the last one "
            f"in {run_dir / 'checkpoints'}), then `reprotune resume {run_dir}` continues the run",
        )
    return NoSpaceError(
        f"{message}{have}; nothing of the run was written",
        source=where,
        fix="free space on that device, then start the run again",
    )
