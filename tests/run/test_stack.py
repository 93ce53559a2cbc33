"""environment.stack: whether the installed libraries are a stack CI proves (the lock or the
floors), and the files that say so agree with pyproject.toml's ranges."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from reprotune._run.fingerprint import installed_distributions
from reprotune._run.stack import pinned, runtime_requirements, stack_facts

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> dict[str, str]:
    """pyproject.toml's runtime requirements: canonical name -> the version after ``>=``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floors: dict[str, str] = {}
    for spec in project["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9A-Za-z.]*)", spec)
        assert match, f"{spec!r}: a runtime requirement is a floor and nothing else (no pin, no cap)"
        floors[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return floors


def test_each_declared_floor_is_the_floor_files_version() -> None:
    """Every floor in pyproject.toml is the version CI installs from floor.txt (the oldest proven),
    and the lock pins every runtime requirement; torch's floor is the oldest release with the APIs
    the code uses, and CI proves torch 2.13.0 on both stacks."""
    floor, lock = pinned("floor"), pinned("lock")
    for name, version in _declared().items():
        assert name in lock, f"{name} is not in the lock"
        if name == "torch":  # declared by the APIs used (2.8); only the 2.13.0 CPU wheel installs here
            assert floor["torch"] == lock["torch"] == "2.13.0" and version == "2.8"
            continue
        assert floor.get(name) == version, f"{name}: pyproject: >={version}, floor.txt: {floor.get(name)}"
    assert set(runtime_requirements()) == set(_declared())


def test_the_environment_running_the_tests_is_a_proven_stack() -> None:
    """CI runs the suite on the lock and a part of it on the floors: each is recognised as such."""
    facts = stack_facts(installed_distributions())
    assert facts["stack"] in ("tested (lock)", "tested (floor)"), facts
    assert facts["differs"] == {}


def test_a_stack_with_one_other_version_is_untested_and_names_it() -> None:
    """One package off the lock: untested, closest to the lock, that package named with both
    versions; a missing package counts as off; torch's local build label does not."""
    lock = pinned("lock")
    names = runtime_requirements()
    stack = {name: lock[name] for name in names}
    stack["torch"] = lock["torch"] + "+cu128"
    assert stack_facts(stack) == {"stack": "tested (lock)", "differs": {}}
    floor = pinned("floor")
    assert stack_facts({name: floor[name] for name in names})["stack"] == "tested (floor)"

    stack["transformers"] = "4.57.1"
    del stack["xxhash"]
    assert stack_facts(stack) == {
        "stack": "untested",
        "closest": "lock",
        "differs": {
            "transformers": {"installed": "4.57.1", "lock": lock["transformers"]},
            "xxhash": {"installed": None, "lock": lock["xxhash"]},
        },
    }


@pytest.mark.parametrize(
    ("versions", "broken"),
    [
        ({"mlflow-skinny": "3.8.1", "sqlalchemy": "2.1.9"}, True),
        ({"mlflow-skinny": "3.1.0", "sqlalchemy": "2.1.0rc1"}, True),
        ({"mlflow": "3.5.0", "sqlalchemy": "2.1.0"}, True),
        ({"mlflow-skinny": "3.9.0", "sqlalchemy": "2.1.9"}, False),
        ({"mlflow-skinny": "3.1.0", "sqlalchemy": "2.0.30"}, False),
        ({"mlflow-skinny": "3.9.0", "sqlalchemy": "2.0.30"}, False),  # the floors: proven
        ({"mlflow-skinny": "3.17.2", "sqlalchemy": "2.1.9"}, False),  # the lock: proven
        ({"sqlalchemy": "2.1.9"}, False),
    ],
)
def test_the_mlflow_and_sqlalchemy_pair_that_cannot_open_a_store_is_named(
    versions: dict[str, str], broken: bool
) -> None:
    """mlflow-skinny (or mlflow) before 3.9 with SQLAlchemy 2.1 or later, a pair the ranges allow:
    named with both versions; the floors' and the lock's pairs are not."""
    from reprotune._run.stack import mlflow_store_problem

    problem = mlflow_store_problem(versions)
    assert (problem is not None) is broken
    if broken:
        name = "mlflow-skinny" if "mlflow-skinny" in versions else "mlflow"
        assert f"{name} {versions[name]} cannot open a SQL tracking store with SQLAlchemy" in str(problem)


def test_the_doctor_warns_of_that_pair_for_a_config_that_mirrors_to_a_sql_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doctor reads the installed versions; with the broken pair (put in its place, since it is
    not installed here) a config mirroring to SQLite gets the warning, one with MLflow off none."""
    from reprotune._config.schema import ExperimentConfig
    from reprotune._doctor import kernel_checks
    from reprotune._doctor.findings import Context

    installed = {"mlflow-skinny": "3.8.1", "sqlalchemy": "2.1.9"}
    monkeypatch.setattr(kernel_checks, "installed_distributions", lambda: installed)

    def context(cfg: ExperimentConfig) -> Context:
        return Context(cfg, True, "cpu", True, {}, {}, tmp_path)

    on = context(ExperimentConfig())
    [finding] = kernel_checks.check_mlflow_store(on)
    assert finding.code == "mlflow-store-broken" and "mlflow-skinny 3.8.1" in finding.title
    off = context(ExperimentConfig.model_validate({"tracking": {"mlflow": False}}))
    assert kernel_checks.check_mlflow_store(off) == []
