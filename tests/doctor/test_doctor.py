"""Tests for reprotune doctor: findings on deliberately bad setups, the probe, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from reprotune._cli import main
from reprotune._config.loading import config_from_dict
from reprotune._data.loaders import load_table
from reprotune._data.manifest import write_manifest
from reprotune._data.split import split_table
from reprotune._determinism.flags import CUBLAS_ENV, precision_flags
from reprotune._doctor import doctor as doctor_module
from reprotune._doctor import probe as _probe
from reprotune._doctor.doctor import run_doctor
from reprotune._doctor.findings import FINDING_CODES, Context, DoctorReport
from reprotune._run.findings import Finding

REPO = Path(__file__).resolve().parents[2]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _doctor_on(
    overrides: list[str], tmp_path: Path, *, probe: bool = False, settings: dict[str, Any] | None = None
) -> DoctorReport:
    """Run the doctor on a config from ``settings`` and ``overrides``, checking git state in tmp_path."""
    cfg = config_from_dict(settings or {}, overrides=overrides)
    return run_doctor(cfg, config_source="test", code_dir=tmp_path, probe=probe)


def _by_code(report: DoctorReport) -> dict[str, Finding]:
    return {f.code: f for f in report.findings}


def test_quickstart_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """`reprotune doctor examples/quickstart.yaml --json` exits 0 with an identical probe."""
    code = main(["doctor", str(REPO / "examples" / "quickstart.yaml"), "--json", "--code-dir", str(REPO)])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["exit_code"] == 0 and report["counts"]["error"] == 0
    assert report["probe"]["status"] == "identical"
    assert report["probe"]["loss"][0] == report["probe"]["loss"][1]


def test_the_json_holds_the_kernel_facts_read_back_under_the_config_s_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A script reading ``--json`` had the CPU kernel mode only inside a finding's title: the
    report holds the kernel facts a run's record would (``environment.kernels``), read back while
    the config's mode was in force (strict: deterministic algorithms on), not after doctor
    restored torch's flags."""
    import torch

    torch.use_deterministic_algorithms(False)  # torch's default, which doctor puts back
    main(
        [
            "doctor",
            str(REPO / "examples" / "quickstart.yaml"),
            "--json",
            "--no-probe",
            "--code-dir",
            str(REPO),
        ]
    )
    kernels = json.loads(capsys.readouterr().out)["kernels"]
    assert kernels["portable"]["cpu_isa"] == "native"
    assert kernels["cpu"]["aten_capability"] == torch.backends.cpu.get_cpu_capability()
    assert kernels["algorithms"]["deterministic_algorithms"] is True
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize(
    ("overrides", "code", "severity"),
    [
        (["train.precision=fp16"], "fp16", "warning"),
        (["model.dtype=float16"], "fp16", "warning"),
        (["determinism.threads=null"], "threads-unpinned", "warning"),
        (["model.name=HuggingFaceTB/SmolLM2-135M"], "model-revision-unpinned", "error"),
        (
            ["model.name=HuggingFaceTB/SmolLM2-135M", "model.revision=main"],
            "model-revision-not-sha",
            "warning",
        ),
        (["determinism.mode=off"], "deterministic-algorithms-off", "warning"),
        (["determinism.mode=warn"], "deterministic-warn-only", "info"),
        (["determinism.device=auto"], "device-auto", "warning"),
    ],
    ids=[
        "fp16",
        "float16-weights",
        "threads",
        "no-revision",
        "branch-revision",
        "mode-off",
        "mode-warn",
        "auto",
    ],
)
def test_bad_config_findings(overrides: list[str], code: str, severity: str, tmp_path: Path) -> None:
    """Each deliberately bad config setting produces its finding, with why and fix."""
    finding = _by_code(_doctor_on(overrides, tmp_path)).get(code)
    assert finding is not None and finding.severity == severity
    assert finding.why and finding.fix


def test_clean_config_has_none_of_those(tmp_path: Path) -> None:
    """The defaults raise none of the config findings above (so those tests can fail)."""
    codes = set(_doctor_on([], tmp_path).codes())
    assert not codes & {
        "fp16",
        "threads-unpinned",
        "model-revision-unpinned",
        "model-revision-not-sha",
        "deterministic-algorithms-off",
        "deterministic-warn-only",
        "device-auto",
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_an_error(tmp_path: Path) -> None:
    """determinism.device=cuda on a machine without a GPU is error-level, and the probe is skipped."""
    report = _doctor_on(["determinism.device=cuda"], tmp_path, probe=True)
    assert {"device-unavailable", "probe-skipped"} <= set(report.codes()) and report.exit_code == 1


def test_env_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TOKENIZERS_PARALLELISM=true and an unset PYTHONHASHSEED are reported; set correctly, they are not."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    codes = set(_doctor_on([], tmp_path).codes())
    assert {"tokenizers-parallelism-on", "pythonhashseed-random"} <= codes
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    assert "tokenizers-parallelism-unset" in _doctor_on([], tmp_path).codes()
    monkeypatch.setenv("PYTHONHASHSEED", "")  # empty: Python randomizes hashes as unset
    assert "pythonhashseed-random" in _doctor_on([], tmp_path).codes()
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    codes = set(_doctor_on([], tmp_path).codes())
    assert not codes & {"tokenizers-parallelism-on", "tokenizers-parallelism-unset", "pythonhashseed-random"}
    # Read as the tokenizers library reads it: any value but "", off, false, f, no, n, 0 is on.
    for on in ("enabled", "t", "y"):
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", on)
        assert "tokenizers-parallelism-on" in _doctor_on([], tmp_path).codes(), on
    for off in ("OFF", "n", "0"):
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", off)
        assert "tokenizers-parallelism-on" not in _doctor_on([], tmp_path).codes(), off


def test_a_stale_torchelastic_run_id_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TORCHELASTIC_RUN_ID left in the environment outside torchrun: exit 2 naming the variables
    the launch lacks (a ValueError traceback, exit 1, before)."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert main(["doctor", "--no-probe", "--code-dir", str(tmp_path)]) == 2
    assert "the launch's variables are not (RANK unset, WORLD_SIZE unset" in capsys.readouterr().err


def test_not_in_git(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A code directory outside git is a warning; a --code-dir that is no directory is bad input
    (it was a git-absent warning, or a file's parent audited silently)."""
    assert _by_code(_doctor_on([], tmp_path))["git-absent"].severity == "warning"
    (tmp_path / "f.txt").write_text("x")
    for given, what in ((tmp_path / "nowhere", "does not exist"), (tmp_path / "f.txt", "is a file")):
        assert main(["doctor", "--no-probe", "--code-dir", str(given)]) == 2
        assert f"--code-dir '{given}' {what}" in capsys.readouterr().err


@needs_git
def test_dirty_git_tree(tmp_path: Path) -> None:
    """A repo with an uncommitted change is a git-dirty warning, not an error; a clean one is neither."""

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    (tmp_path / "train.py").write_text("a = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "init")
    clean = _doctor_on([], tmp_path)
    assert not {"git-dirty", "git-absent"} & set(clean.codes())
    (tmp_path / "train.py").write_text("a = 2\n")
    report = _doctor_on([], tmp_path)
    assert _by_code(report)["git-dirty"].severity == "warning" and report.exit_code == 0
    git("checkout", "-q", "train.py")
    # The run's own MLflow store and artifacts are no code (the run records the tree clean), and
    # an untracked file whose name is not UTF-8 is shown escaped (a UnicodeEncodeError before).
    tracking = [
        f"tracking.uri=sqlite:///{tmp_path}/tracking/store.db",
        f"tracking.artifact_location={tmp_path}/tracking/art",
    ]
    (tmp_path / "tracking" / "art" / "0").mkdir(parents=True)
    (tmp_path / "tracking" / "store.db").write_text("")
    (tmp_path / "tracking" / "art" / "0" / "m.txt").write_text("")
    assert "git-dirty" not in _doctor_on(tracking, tmp_path).codes()
    (tmp_path / os.fsdecode(b"notes-\xff.txt")).write_text("")
    dirty = _by_code(_doctor_on(tracking, tmp_path))["git-dirty"]
    assert "notes-\\xff.txt" in dirty.title and json.dumps(dirty.title, ensure_ascii=False).encode("utf-8")


@needs_git
def test_a_repository_without_a_commit_is_said_so(tmp_path: Path) -> None:
    """`git init` and nothing committed: the record cannot name the code, so a warning (it gave no
    finding); an empty PYTHONHASHSEED randomizes as an unset one does, and is said so."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, capture_output=True)
    assert _by_code(_doctor_on([], tmp_path))["git-no-commit"].severity == "warning"


def _data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "hi", "response": "hello"}\n{"prompt": "a", "response": "b"}\n')
    return path


def test_data_without_manifest(tmp_path: Path) -> None:
    """A data file with no split manifest is a warning."""
    report = _doctor_on([], tmp_path, settings={"data": {"path": str(_data_file(tmp_path))}})
    assert _by_code(report)["data-no-manifest"].severity == "warning"


def test_builtin_data_with_a_manifest_of_other_data_is_an_error(tmp_path: Path) -> None:
    """The embedded corpus with a manifest made from another file: the run refuses it (exit 2),
    so the doctor says so (it said OK); with the corpus's own manifest, nothing."""
    data = _data_file(tmp_path)
    foreign, own = tmp_path / "foreign.json", tmp_path / "own.json"
    write_manifest(split_table(load_table(str(data)), seed=0), foreign)
    write_manifest(split_table(load_table("builtin:chatterbot-en"), seed=0), own)
    for manifest, expected in ((foreign, {"data-manifest-mismatch"}), (own, set())):
        settings = {"data": {"path": "builtin:chatterbot-en"}, "split": {"manifest": str(manifest)}}
        codes = {c for c in _doctor_on([], tmp_path, settings=settings).codes() if c.startswith("data-")}
        assert codes == expected, (manifest, codes)


def test_manifest_matching_and_mismatching(tmp_path: Path) -> None:
    """A manifest made from the file passes; once the file changes it is an error; garbage is an error."""
    data = _data_file(tmp_path)
    manifest = tmp_path / "split.json"
    write_manifest(split_table(load_table(str(data)), seed=0), manifest)
    settings = {"data": {"path": str(data)}, "split": {"manifest": str(manifest)}}
    codes = set(_doctor_on([], tmp_path, settings=settings).codes())
    assert not {c for c in codes if c.startswith("data-")}
    # The same rows reformatted (keys in another order, CRLF): the split holds, as check-split and
    # the run say; it was an error whose reason ("indices would point at different rows") was false.
    original = data.read_text()
    rows = [json.loads(line) for line in original.splitlines()]
    data.write_text("".join(json.dumps(dict(reversed(list(r.items())))) + "\r\n" for r in rows))
    codes = set(_doctor_on([], tmp_path, settings=settings).codes())
    assert not {c for c in codes if c.startswith("data-")}
    data.write_text(original + '{"prompt": "new", "response": "row"}\n')
    report = _doctor_on([], tmp_path, settings=settings)
    assert _by_code(report)["data-manifest-mismatch"].severity == "error" and report.exit_code == 1
    manifest.write_text("not json")
    assert "data-manifest-unreadable" in _doctor_on([], tmp_path, settings=settings).codes()


def test_probe_detects_differing_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When two probe passes differ, the doctor reports an error."""
    results = iter([("0x1.0p+0", "a"), ("0x1.0000000000001p+0", "a")])
    monkeypatch.setattr(_probe, "_probe_pass", lambda device: next(results))
    report = _doctor_on([], tmp_path, probe=True)
    assert _by_code(report)["probe-differs"].severity == "error" and report.exit_code == 1
    assert report.probe is not None and report.probe["status"] == "differs"


def test_probe_reports_a_raising_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An op that raises under strict mode is an error-level probe failure naming the message."""

    def boom(device: str) -> tuple[str, str]:
        raise RuntimeError("index_add_cuda_ does not have a deterministic implementation")

    monkeypatch.setattr(_probe, "_probe_pass", boom)
    finding = _by_code(_doctor_on([], tmp_path, probe=True))["probe-failed"]
    assert finding.severity == "error" and "index_add_cuda_" in finding.title


def test_doctor_leaves_torch_flags_alone(tmp_path: Path) -> None:
    """Auditing a mode-off config does not change the process's torch flags or thread count."""
    torch.use_deterministic_algorithms(True)
    threads = torch.get_num_threads()
    _doctor_on(["determinism.mode=off", "determinism.threads=1"], tmp_path, probe=True)
    assert torch.are_deterministic_algorithms_enabled() and torch.get_num_threads() == threads


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 1 for an error-level finding, 2 for a bad config (every problem listed); text by default."""
    assert main(["doctor", "--set", "model.name=org/model", "--no-probe", "--code-dir", str(tmp_path)]) == 1
    assert "ERROR   model-revision-unpinned" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  precison: fp16\n  batch_size: 0\n")
    assert main(["doctor", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'precision'?" in err and "train.batch_size" in err


def test_every_code_is_known_and_documented(tmp_path: Path) -> None:
    """Every finding code is in FINDING_CODES and docs/doctor.md explains each one."""
    doc = (REPO / "docs" / "doctor.md").read_text(encoding="utf-8")
    for code in FINDING_CODES:
        assert f"`{code}`" in doc, code
    report = _doctor_on(["determinism.mode=off", "determinism.threads=null"], tmp_path, probe=True)
    assert set(report.codes()) <= set(FINDING_CODES)


def test_every_code_a_check_can_emit_is_listed() -> None:
    """Each ``Finding("code", ...)`` written in the doctor's checks is in FINDING_CODES (two were
    not: git-no-commit and mlflow-store-broken, so a report with either failed the check above)."""
    import ast

    emitted = set()
    for module in (REPO / "src" / "reprotune" / "_doctor").glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    emitted.add(first.value)
    assert len(emitted) > 30 and emitted <= set(FINDING_CODES), sorted(emitted - set(FINDING_CODES))


def test_doctor_names_columns_the_data_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """prompt_field and stratify_by naming absent columns: one error each, with the key, its line
    and column in the config, and the columns there are (the data is read without torch)."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "p", "response": "r", "category": "a"}\n' * 4)
    config = tmp_path / "cfg.yaml"
    config.write_text(
        "data:\n  path: data.jsonl\n  prompt_field: question\nsplit:\n  stratify_by: categroy\n"
        "determinism:\n  device: cpu\n"
    )
    code = main(["doctor", str(config), "--json", "--no-probe", "--code-dir", str(tmp_path)])
    report = json.loads(capsys.readouterr().out)
    missing = [f for f in report["findings"] if f["code"] == "config-column-missing"]
    assert code == 1 and [f["severity"] for f in missing] == ["error", "error"]
    columns = "['prompt', 'response', 'category']"
    assert missing[0]["title"] == (
        f"data.prompt_field names column 'question', which {data} does not have "
        f"({config}, line 3, column 17 (key data.prompt_field))"
    )
    assert missing[1]["title"] == (
        f"split.stratify_by names column 'categroy', which {data} does not have "
        f"({config}, line 5, column 16 (key split.stratify_by))"
    )
    assert missing[1]["fix"] == f"set split.stratify_by to one of the data's columns: {columns}"
    # A value given with --set is named as the --set, not as the file's line it overrode.
    args = ["doctor", str(config), "--json", "--no-probe", "--code-dir", str(tmp_path)]
    assert main([*args, "--set", "split.stratify_by=kind"]) == 1
    report = json.loads(capsys.readouterr().out)
    missing = [f for f in report["findings"] if f["code"] == "config-column-missing"]
    assert missing[1]["title"].endswith("does not have (--set split.stratify_by=kind)")


def test_split_command_makes_the_runs_split(tmp_path: Path) -> None:
    """The command data-no-manifest prints, run as printed, writes the very manifest a run makes."""
    import shlex

    from reprotune._determinism.seeds import derive_seeds
    from reprotune._train.data import prepare_data
    from reprotune.testing import write_tiny_dataset

    data = write_tiny_dataset(tmp_path / "data.jsonl", 60, seed=0, n_categories=3)
    settings = {
        "seed": {"root": 9},
        "data": {"path": str(data)},
        "split": {"stratify_by": "category", "ratios": [0.7, 0.2, 0.1]},
    }
    finding = _by_code(_doctor_on([], tmp_path, settings=settings))["data-no-manifest"]
    command = finding.fix.split("`")[1]
    assert f"--seed {derive_seeds(9)['split']}" in command
    argv = shlex.split(command)
    assert argv[:2] == ["reprotune", "split"]
    out = tmp_path / "split.json"
    argv[argv.index("--out") + 1] = str(out)
    assert main(argv[1:]) == 0
    cfg = config_from_dict(settings)
    prepare_data(cfg, derive_seeds(9), tmp_path / "run-split.json")
    assert out.read_bytes() == (tmp_path / "run-split.json").read_bytes()


def test_a_revision_for_a_local_model_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """model.revision with a local directory: the run refuses it (exit 2), and so does doctor now
    (it said OK)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # a model folder (one without is refused first)
    args = ["doctor", "--no-probe", "--code-dir", str(tmp_path), "--set", f"model.name={tmp_path / 'model'}"]
    assert main([*args, "--set", "model.revision=main"]) == 2
    err = capsys.readouterr().err
    assert "model.revision 'main' was given but" in err and "which has no revisions" in err


def test_set_without_a_config_is_still_the_defaults_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``doctor --set KEY=VALUE`` with no CONFIG audits the defaults with that override, and the
    report says no config was given, naming the --set (before, it said nothing of the kind)."""
    code = main(
        ["doctor", "--no-probe", "--code-dir", str(tmp_path), "--set", "train.learning_rate=0.01", "--json"]
    )
    findings = {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert code in (0, 1)
    assert findings["no-config"]["title"] == (
        "no config given: audited the default config with --set train.learning_rate=0.01"
    )


def test_the_split_command_writes_beside_the_config_that_will_name_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Doctor run from another directory than the config's: the printed command writes split.json
    beside the config, where the fix's `split.manifest: split.json` resolves (before: into the
    current directory, where the config never looks)."""
    from reprotune.testing import write_tiny_dataset

    project = tmp_path / "project"
    project.mkdir()
    write_tiny_dataset(project / "data.jsonl", 30, seed=0, n_categories=3)
    (project / "cfg.yaml").write_text("data:\n  path: data.jsonl\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    main(["doctor", str(project / "cfg.yaml"), "--no-probe", "--code-dir", str(tmp_path), "--json"])
    findings = {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    command = findings["data-no-manifest"]["fix"].split("`")[1]
    assert command.endswith(f"--out {project / 'split.json'}")


def _codes(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict[str, dict[str, Any]]]:
    code = main([*args, "--json"])
    return code, {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}


def test_set_with_a_config_is_checked_against_the_config_not_the_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config that samples and ``--set eval.top_k=5``: valid, as run takes it (doctor applied
    the --set to the defaults too, greedy, and refused it: exit 2)."""
    config = tmp_path / "cfg.yaml"
    config.write_text("eval:\n  decoding: sample\n")
    code, _ = _codes(
        capsys, ["doctor", str(config), "--no-probe", "--code-dir", str(tmp_path), "--set", "eval.top_k=5"]
    )
    assert code in (0, 1)


def test_a_manifest_of_other_data_names_the_split_command_of_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """data-manifest-mismatch with builtin data: its fix is the config's own split command (it
    said `reprotune split builtin:...`, which lacks --out and the config's seed and strategy)."""
    from reprotune._doctor.data_checks import split_command

    data = tmp_path / "other.jsonl"
    data.write_text("".join(f'{{"prompt": "p{i}", "response": "r", "category": "c"}}\n' for i in range(20)))
    assert main(["split", str(data), "--out", str(tmp_path / "split.json")]) == 0
    capsys.readouterr()
    sets = ["--set", f"split.manifest={tmp_path / 'split.json'}"]
    code, found = _codes(capsys, ["doctor", "--no-probe", "--code-dir", str(tmp_path), *sets])
    assert code == 1 and found["data-manifest-mismatch"]["severity"] == "error"
    cfg = config_from_dict({}, overrides=[f"split.manifest={tmp_path / 'split.json'}"])
    assert f"`{split_command(cfg)}`" in found["data-manifest-mismatch"]["fix"]
    assert "--out" in split_command(cfg)


def test_the_last_set_of_a_key_is_named_where_its_value_came_from(tmp_path: Path) -> None:
    """Two --set of one key: the last is in force, and named (the first was)."""

    ctx = Context.__new__(Context)
    object.__setattr__(ctx, "overrides", ("split.stratify_by=category", "split.stratify_by=nope"))
    object.__setattr__(ctx, "config_source", None)
    assert ctx.where("split.stratify_by") == "--set split.stratify_by=nope"


def test_nccl_variables_are_not_asked_for_where_there_is_no_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """determinism.device cuda on a machine without one: device-unavailable, and no NCCL noise."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the case is a machine without one")
    args = ["doctor", "--no-probe", "--code-dir", str(tmp_path), "--set", "determinism.device=cuda"]
    _, found = _codes(capsys, args)
    assert "device-unavailable" in found and "nccl-algo-unpinned" not in found


def test_split_columns_are_ignored_beside_a_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """split.manifest set: the split options are ignored (docs/config.md), so a stale
    split.stratify_by naming no column is no finding (doctor said error, run refused it)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"prompt": "p{i}", "response": "r", "category": "c"}}\n' for i in range(20)))
    assert main(["split", str(data), "--out", str(tmp_path / "split.json")]) == 0
    capsys.readouterr()
    sets = [f"data.path={data}", f"split.manifest={tmp_path / 'split.json'}", "split.stratify_by=categ"]
    _, found = _codes(
        capsys,
        ["doctor", "--no-probe", "--code-dir", str(tmp_path), *(a for s in sets for a in ("--set", s))],
    )
    assert "config-column-missing" not in found
    found_without = config_from_dict({}, overrides=[sets[0], sets[2]])
    from reprotune._data.columns import config_columns

    assert ("split.stratify_by", "categ") in config_columns(found_without)


@pytest.mark.skipif(not hasattr(torch.backends, "fp32_precision"), reason="torch before 2.9")
@pytest.mark.parametrize("mode", ["strict", "off"])
@pytest.mark.usefixtures("fresh_precision")
def test_doctor_audits_and_restores_the_new_precision_api(tmp_path: Path, mode: str) -> None:
    """torch.backends.fp32_precision set before the doctor (by a user, or transformers' tf32): the
    doctor does not fail on the mix of torch's precision APIs, reads the mode's settings back, and
    leaves torch reading what it read before."""
    torch.backends.fp32_precision = "tf32"
    before = precision_flags()
    report = _doctor_on([f"determinism.mode={mode}"], tmp_path)
    assert report.flags["fp32_precision"] == ("ieee" if mode == "strict" else "none")
    assert report.flags["fp32_precision_mixed"] == []
    assert precision_flags() == before


@pytest.mark.parametrize("handle_made", [False, True], ids=["no-handle", "handle-made"])
def test_doctor_keeps_a_cublas_workspace_its_probe_may_have_put_in_force(
    monkeypatch: pytest.MonkeyPatch, handle_made: bool
) -> None:
    """CUBLAS_WORKSPACE_CONFIG set by the doctor's mode is taken back, unless torch may have made
    a cuBLAS handle under it meanwhile (its probe on a GPU): then it is this process's value, and a
    run after the doctor would be refused (strict) for setting it too late."""
    monkeypatch.delenv(CUBLAS_ENV, raising=False)
    in_use = iter([False, handle_made])
    monkeypatch.setattr(doctor_module, "cublas_may_be_in_use", lambda: next(in_use))
    with doctor_module._torch_state_preserved():
        os.environ[CUBLAS_ENV] = ":4096:8"
    assert os.environ.get(CUBLAS_ENV) == (":4096:8" if handle_made else None)


def test_the_workers_finding_and_its_doc_say_the_same(tmp_path: Path) -> None:
    """dataloader-workers: the finding and docs/doctor.md both say reprotune uses no DataLoader
    workers (the doc said it seeded its own workers)."""
    doc = (REPO / "docs" / "doctor.md").read_text(encoding="utf-8")
    row = next(line for line in doc.splitlines() if line.startswith("| `dataloader-workers` |"))
    finding = _by_code(_doctor_on([], tmp_path))["dataloader-workers"]
    assert "uses no DataLoader workers" in finding.title and "uses no DataLoader workers" in row
