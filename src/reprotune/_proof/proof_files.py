"""The fields of ``verification.json`` and a bundle rerun's ``rerun.json`` that the report reads,
checked for their types before a page is built from them: a file edited or damaged by hand is
bad input naming its keys, not a traceback half-way through a page. Keys beyond these are kept
(older and newer files hold others)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

from reprotune._documents import validated

Number = StrictInt | StrictFloat


class _Fields(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class _Leg(_Fields):
    name: StrictStr
    verdict: StrictStr | None = None
    expected: StrictStr | None = None
    passed: StrictBool | None = None
    wall_s: Number | None = None
    note: StrictStr | None = None
    run_dir: StrictStr | None = None
    prefix: StrictBool | None = None


class _Verification(_Fields):
    verdict: StrictStr
    mode: StrictStr | None = None
    config_sha256: StrictStr | None = None
    command: StrictStr | None = None
    reference: StrictStr | None = None
    resume_at: StrictInt | None = None
    legs: list[_Leg] = []
    wall_s: Number | None = None
    legs_s: Number | None = None
    reference_s: Number | None = None
    cost: Number | None = None
    machine: dict[str, Any] | None = None
    spot: dict[str, Any] | None = None


class _BundleRerun(_Fields):
    verdict: StrictStr
    bundle: StrictStr | None = None
    bundle_sha256: StrictStr | None = None
    tolerance: Number | None = None
    largest_loss_difference: Number | None = None
    causes: list[StrictStr] = []
    environment_differences: list[StrictStr] = []
    code_drift_allowed: StrictBool | None = None  # absent from files written before it was recorded
    code_drift: list[StrictStr] = []
    host: StrictStr | None = None
    seconds: Number | None = None


def checked_verification(data: dict[str, Any], *, source: str, fix: str) -> dict[str, Any]:
    """``data`` (a verification, its schema checked) when the fields the report reads have their
    types.

    Raises:
        InputError: every field that has not, each named by its key.
    """
    validated(_Verification, data, what="verification", source=source, fix=fix)
    return data


def checked_bundle_rerun(data: dict[str, Any], *, source: str, fix: str) -> dict[str, Any]:
    """``data`` (a bundle rerun summary, its schema checked) when the fields the report reads have
    their types.

    Raises:
        InputError: every field that has not, each named by its key.
    """
    validated(_BundleRerun, data, what="bundle rerun summary", source=source, fix=fix)
    return data
