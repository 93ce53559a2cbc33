"""Every JSON document reprotune writes for a user to keep, in one table: its schema name, the
version this reprotune writes and reads, and what messages call it (docs/run-directory.md lists
the files). A writer stamps a document with :meth:`DocumentFormat.stamp`; a reader checks one with
:meth:`DocumentFormat.check` (the schema and version, the key at fault named) before validating it
against the format's model (``_documents.validated``). A format's version goes up when what it
holds changes; a version a reader cannot read is refused with the fix, never half-read.

Not here: the ledger's lines (``_run.ledger`` owns its line schema), the RNG state files
(``_determinism.rng``: ``format``/``version`` keys of their own), and files one process hands to a
child of the same reprotune (the spot-check plan, the eval's GEMM-plan cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from reprotune._documents import check_document


@dataclass(frozen=True)
class DocumentFormat:
    """One JSON document format: ``schema`` and ``schema_version`` head every document of it."""

    schema: str
    version: int
    what: str
    """What the document is, for messages (``"run record"``)."""
    older: tuple[int, ...] = ()
    """Earlier versions this reprotune still reads (their readers take what a version lacks)."""

    @property
    def versions(self) -> frozenset[int]:
        """Every version this reprotune reads: the one it writes and the older ones."""
        return frozenset((self.version, *self.older))

    def stamp(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``body`` as a document of this format: ``schema`` and ``schema_version`` added (a body
        stamped already keeps its own)."""
        return {"schema": self.schema, "schema_version": self.version, **body}

    def check(
        self,
        data: Any,
        *,
        source: str,
        fix: str,
        version_fix: str = "use the reprotune version that wrote it, or upgrade",
        what: str | None = None,
    ) -> dict[str, Any]:
        """``data`` (parsed JSON) as a document of this format, returned as it is.

        Args:
            source: where it came from (a path), named in the error with the key at fault.
            fix: what to do when it is not such a document at all.
            version_fix: what to do when it is of a version this reprotune does not read.
            what: the name in messages, when the reader knows better (``"bundle manifest (...)"``).

        Raises:
            SchemaVersionError: no object, another schema, or a version this reprotune does not read.
        """
        return check_document(
            data,
            schema=self.schema,
            versions=self.versions,
            what=what or self.what,
            source=source,
            fix=fix,
            version_fix=version_fix,
        )

    def holds(self, data: Any) -> TypeGuard[dict[str, Any]]:
        """Whether ``data`` (parsed JSON) says it is a document of this format, of any version."""
        return isinstance(data, dict) and data.get("schema") == self.schema


RECORD: Final = DocumentFormat("reprotune/record", 1, "run record")
CHECKPOINT: Final = DocumentFormat("reprotune/checkpoint", 2, "checkpoint state")
"""2: state.json carries its own sha256 and must list exactly the checkpoint's data files."""
SPLIT_MANIFEST: Final = DocumentFormat("reprotune/split-manifest", 1, "split manifest")
EVAL: Final = DocumentFormat("reprotune/eval", 1, "eval record")
EVAL_COMPARISON: Final = DocumentFormat("reprotune/eval-comparison", 1, "eval comparison")
COMPARISON: Final = DocumentFormat("reprotune/comparison", 2, "comparison")
"""2: next_steps (the trace commands)."""
TRACE: Final = DocumentFormat("reprotune/trace", 3, "trace")
"""2: a random op's generator state as an input, ``uninitialized`` memory, step 0 (the LoRA init)."""
TRACE_COMPARISON: Final = DocumentFormat("reprotune/trace-comparison", 1, "trace comparison")
VERIFICATION: Final = DocumentFormat("reprotune/verification", 5, "verification", older=(1, 2, 3, 4))
"""2: mode, per-leg cost, machine, blame; 3: wall_s (legs side by side); 4: legs' prefix; 5: mode
spot and its spot section."""
COMMAND_VERIFICATION: Final = DocumentFormat(
    "reprotune/command-verification", 3, "command verification", older=(1, 2)
)
"""2: spot (``verify --command --spot``); 3: what a config's verification holds besides (mode
``command``, config_sha256 and reference of the reference leg's run, reference_s, machine, wall_s,
legs_s, cost)."""
BUNDLE: Final = DocumentFormat("reprotune/bundle", 1, "bundle manifest")
BUNDLE_RERUN: Final = DocumentFormat("reprotune/bundle-rerun", 1, "bundle rerun summary")
STUDY: Final = DocumentFormat("reprotune/study", 1, "study")
SIGNIFICANCE: Final = DocumentFormat("reprotune/significance", 1, "significance test")
DOCTOR: Final = DocumentFormat("reprotune/doctor", 1, "doctor report")
BUILTIN_MODEL: Final = DocumentFormat("reprotune/builtin-model", 1, "builtin model metadata")

#: Every format, for the test that no writer spells a schema of its own.
ALL: Final = (
    RECORD, CHECKPOINT, SPLIT_MANIFEST, EVAL, EVAL_COMPARISON, COMPARISON, TRACE, TRACE_COMPARISON,
    VERIFICATION, COMMAND_VERIFICATION, BUNDLE, BUNDLE_RERUN, STUDY, SIGNIFICANCE, DOCTOR, BUILTIN_MODEL,
)  # fmt: skip
