"""A run's record while the run goes: typed and frozen, changed only through named operations,
each checked against the schema where it is made.

The record of an attempt grows as the run goes: the attempt begins, the setup's sections and the
code and environment fingerprints are filled in, a resume notes what drifted and what it
restored, and the end brings the status, error, outputs, timings and the trackers' summaries.
:class:`LiveRecord` holds it, and each of those changes is one of its methods. A change makes a
new record, validated into a frozen ``_run.record.RunRecord`` (:attr:`LiveRecord.typed`) before
it replaces the old one: a change the schema refuses fails at the operation that made it and
leaves the record as it was. Readers get copies (``record["data"]`` cannot be edited behind its
back). :meth:`LiveRecord.write` writes the record's data exactly as the operations made it
(``_run.record.write_record``); what a finished run returns is :meth:`LiveRecord.document`, a
plain copy.

Every path that writes a run directory uses it: ``reprotune run`` and ``resume`` (on one process
or on rank 0 under torchrun, ``_train.attempt``, ``_train.dist_record``) and the Trainer callback
(``integrations._writer``), through ``_train.writer.RunWriter``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Literal, get_args

from reprotune._config.schema import ExperimentConfig
from reprotune._config.secrets import mask_url_credentials
from reprotune._run.record import (
    RunRecord,
    Status,
    load_record,
    start_record,
    typed_record,
    utc_now,
    write_record,
)

#: The sections a run fills in from what it computes (the rest, ``run_id``, ``config``, ``seeds``
#: and the like, are set when the record starts and never change).
Section = Literal[
    "determinism", "data", "model", "lora", "lora_defaults", "code", "environment", "distributed"
]
SECTIONS: Final[frozenset[str]] = frozenset(get_args(Section))


class LiveRecord(Mapping[str, Any]):
    """The record of a running attempt (see the module docstring).

    Raises:
        ValueError: ``data`` (or a change an operation makes) does not satisfy the record's schema.
    """

    __slots__ = ("_data", "_typed")

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data: dict[str, Any] = {}
        self._typed: RunRecord
        self._commit(copy.deepcopy(dict(data)), "a record")

    @classmethod
    def start(cls, run_id: str, cfg: ExperimentConfig, seeds: Mapping[str, int]) -> LiveRecord:
        """A new run's record: running, config, its hash, seeds, start time; no attempt yet."""
        return cls(start_record(run_id, cfg, seeds))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LiveRecord:
        """The record of the run in ``path`` (a run directory or its ``record.json``), validated."""
        return cls(load_record(path))

    # -- reading: copies -------------------------------------------------------------------------

    @property
    def typed(self) -> RunRecord:
        """The record as typed, frozen data (its sections' dicts are copies of the record's)."""
        return self._typed

    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._data[key])

    def __contains__(self, key: object) -> bool:
        return key in self._data  # without the copy Mapping's own would make

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def document(self) -> dict[str, Any]:
        """The whole record, a plain copy."""
        return copy.deepcopy(self._data)

    def write(self, path: str | os.PathLike[str]) -> str:
        """Write the record atomically as canonical JSON; return the bytes' sha256."""
        return write_record(path, self._data)

    # -- every change: a draft, checked, then in place of the record -----------------------------

    def _draft(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)

    def _commit(self, data: dict[str, Any], operation: str) -> None:
        try:
            typed = typed_record(copy.deepcopy(data))
        except ValueError as exc:
            raise ValueError(f"{operation} would make an invalid run record: {exc}") from None
        self._data, self._typed = data, typed

    # -- an attempt ------------------------------------------------------------------------------

    def begin_attempt(self, *, resumed: bool, **facts: Any) -> None:
        """Mark the run running and add an attempt, begun now (``facts``: what it resumed from...)."""
        data = self._draft()
        data.update(status="running", error=None)
        data.setdefault("attempts", []).append(
            {"started_at": utc_now(), "resumed": resumed, **copy.deepcopy(facts)}
        )
        self._commit(data, "begin_attempt")

    def note_attempt(self, **facts: Any) -> None:
        """Add ``facts`` to the current attempt (what it restored, a world-size change...)."""
        data = self._draft()
        _attempt(data).update(copy.deepcopy(facts))
        self._commit(data, "note_attempt")

    def note_drift(self, lines: Iterable[str]) -> None:
        """Add to the attempt's ``drift`` how a setup section differs now from the run's start."""
        data = self._draft()
        _attempt(data).setdefault("drift", []).extend(lines)
        self._commit(data, "note_drift")

    # -- the run's sections ----------------------------------------------------------------------

    def set_section(self, key: Section, value: Mapping[str, Any]) -> None:
        """Fill in one of the sections a run computes (:data:`Section`)."""
        if key not in SECTIONS:
            raise ValueError(f"{key!r} is not a section a run fills in ({', '.join(sorted(SECTIONS))})")
        data = self._draft()
        data[key] = copy.deepcopy(dict(value))
        self._commit(data, f"set_section({key!r})")

    def set_manifest_sha256(self, sha256: str) -> None:
        """The hash of the split manifest written into the run directory."""
        data = self._draft()
        data["data"]["manifest_sha256"] = sha256
        self._commit(data, "set_manifest_sha256")

    def add_world_size_change(self, entry: Mapping[str, Any]) -> None:
        """An allowed world-size change at a resume: on the ``distributed`` section and the attempt."""
        data = self._draft()
        data["distributed"].setdefault("world_size_changes", []).append(dict(entry))
        _attempt(data)["world_size_change"] = dict(entry)
        self._commit(data, "add_world_size_change")

    # -- the end ---------------------------------------------------------------------------------

    def end(self, status: Status, error: BaseException | None = None) -> None:
        """How the attempt ended, and why when it failed (the message with its secrets redacted)."""
        data = self._draft()
        data["status"] = status
        if error is not None:
            data["error"] = {"type": type(error).__name__, "message": mask_url_credentials(str(error))}
        self._commit(data, "end")

    def set_outputs(self, outputs: Mapping[str, Any]) -> None:
        """The hashes of what a completed run produced."""
        data = self._draft()
        data["outputs"] = copy.deepcopy(dict(outputs))
        self._commit(data, "set_outputs")

    def add_timings(self, timings: Mapping[str, Any]) -> None:
        """This attempt's timings (its end time, duration, step times...)."""
        data = self._draft()
        data["timings"].update(copy.deepcopy(dict(timings)))
        self._commit(data, "add_timings")

    def set_trackers(self, summaries: Mapping[str, Any]) -> None:
        """What each tracker reported at the end (ids, links), secrets redacted by the caller."""
        data = self._draft()
        data["trackers"] = copy.deepcopy(dict(summaries))
        self._commit(data, "set_trackers")


def _attempt(data: dict[str, Any]) -> dict[str, Any]:
    attempts = data.get("attempts") or []
    if not attempts:
        raise RuntimeError("the record has no attempt yet: begin_attempt first")
    last: dict[str, Any] = attempts[-1]
    return last
