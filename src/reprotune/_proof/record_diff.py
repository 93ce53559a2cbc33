"""What two run records differ in: every recorded value, by key path, in its category. No torch."""

from __future__ import annotations

from collections.abc import Iterable

from reprotune._config.schema import NEUTRAL_DEFAULTS
from reprotune._jsonio import empty_beside_keys, flattened
from reprotune._proof.differences import Category, Difference
from reprotune._proof.inert import is_inert
from reprotune._proof.microscope import kernels_of
from reprotune._run.rundir import RunDir

# Record section -> the category its differences are listed under. Sections left out (run_id,
# status, timings, outputs, config_sha256) are results or identities, not possible causes.
_SECTIONS: dict[str, Category] = {
    "config": "config",
    "seeds": "seeds",
    "code": "code",
    "reprotune_version": "code",
    "data": "data",
    "model": "model",
    "lora": "lora",
    "environment": "environment",
    "distributed": "distributed",
}


_KERNELS = "environment.kernels."
_NEUTRAL = {f"config.{key}": value for key, value in NEUTRAL_DEFAULTS.items()}


def record_differences(run_a: RunDir, run_b: RunDir) -> Iterable[Difference]:
    """Every recorded value that differs, by section, in key-path order. Kernel facts are their
    own category, compared only when both records hold them (older records do not: unknown, said
    by the causes); a key one record lacks because it predates it, at the value that meant the
    same (``NEUTRAL_DEFAULTS``), is no difference."""
    both_kernels = kernels_of(run_a) is not None and kernels_of(run_b) is not None
    for section, section_category in _SECTIONS.items():
        flat_a = flattened(run_a.record[section], section) if section in run_a.record else {}
        flat_b = flattened(run_b.record[section], section) if section in run_b.record else {}
        for key in sorted(set(flat_a) | set(flat_b)):
            inert = is_inert(key, flat_a.get(key), flat_b.get(key))
            category: Category = "kernels" if key.startswith(_KERNELS) else section_category
            if category == "kernels" and not both_kernels:
                continue
            if key in _NEUTRAL and flat_a.get(key, _NEUTRAL[key]) == flat_b.get(key, _NEUTRAL[key]):
                continue
            if empty_beside_keys(key, flat_a, flat_b):
                continue
            if key not in flat_b:
                yield Difference(category, key, flat_a[key], None, "removed", inert)
            elif key not in flat_a:
                yield Difference(category, key, None, flat_b[key], "added", inert)
            elif flat_a[key] != flat_b[key] or type(flat_a[key]) is not type(flat_b[key]):
                yield Difference(category, key, flat_a[key], flat_b[key], "changed", inert)
