"""``reprotune eval`` refuses what is not the run's (its split, config, adapter weights, base model
weights, chat template) before it loads or writes anything, and lands every default eval, two of
one identity in one second included."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import reprotune._eval.evaluate as evaluate_mod
import reprotune._run.outputs as outputs_mod
from reprotune._cli import main
from reprotune._cli.eval import summary
from reprotune._eval.evaluate import run_eval

TINY = {"eval": {"batch_size": 8, "max_new_tokens": 4}}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny project of its own (tests here damage its model files, and put them back)."""
    from tinyrun import TinyProject

    return TinyProject.create(tmp_path_factory.mktemp("eval-refusals"))


@pytest.fixture(scope="module")
def run_a(project: Any) -> Path:
    project.run_cli("run", str(project.config("a.yaml", **TINY)), "--run-dir", "runA", "--no-progress")
    return Path(project.root / "runA")


@pytest.fixture()
def run(run_a: Path, tmp_path: Path) -> Path:
    """A copy of the run, without evals, for a test to edit."""
    return Path(shutil.copytree(run_a, tmp_path / "run", ignore=shutil.ignore_patterns("evals")))


@pytest.fixture()
def model_restored(project: Any) -> Iterator[Path]:
    """The project's base model directory, put back as it was after a test that damages it."""
    model = project.root / "tiny-model"
    saved = {f: f.read_bytes() for f in model.iterdir() if f.is_file()}
    yield model
    for f, data in saved.items():
        f.write_bytes(data)


def _listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _edit_record(run: Path, edit: Any) -> dict[str, Any]:
    record = json.loads((run / "record.json").read_text(encoding="utf-8"))
    edit(record)
    (run / "record.json").write_text(json.dumps(record), encoding="utf-8")
    return record


def _refused(capsys: pytest.CaptureFixture[str], run: Path, *args: str) -> str:
    before = _listing(run)
    assert main(["eval", str(run), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err and "fix:" in err, err
    assert _listing(run) == before
    return err


def test_a_split_json_that_is_not_the_recorded_one_is_refused(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another split of the same data (training rows moved into test) passed the data check and was
    scored as the test split, exit 0; now exit 2 naming split.json, both hashes and the fix."""
    manifest = json.loads((run / "split.json").read_text(encoding="utf-8"))
    manifest["test"], manifest["train"] = (
        sorted([*manifest["test"][1:], manifest["train"][0]]),
        sorted([*manifest["train"][1:], manifest["test"][0]]),
    )
    (run / "split.json").write_text(json.dumps(manifest), encoding="utf-8")
    from reprotune._jsonio import sha256_file

    found = sha256_file(run / "split.json")
    recorded = json.loads((run / "record.json").read_text())["data"]["manifest_sha256"]
    err = _refused(capsys, run)
    assert f"{run / 'split.json'} is not the split the run was made with" in err
    assert f"its sha256 is {found[:12]}..." in err and f"data.manifest_sha256 is {recorded[:12]}..." in err
    assert "fix: restore the run's own split.json" in err


def test_an_edited_record_config_is_refused(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record whose config was edited (here eval.max_new_tokens) was evaluated with it and
    reported under the old config_sha256; now exit 2 naming record.json and both hashes. The
    same setting given with --set (after the check) is an eval's own and evaluates."""
    from reprotune._config.schema import config_sha256
    from reprotune._run.record import record_config

    record = _edit_record(run, lambda r: r["config"]["eval"].update(max_new_tokens=2))
    edited = config_sha256(record_config(record, run_dir=run, source="record.json"))
    err = _refused(capsys, run)
    assert f"the config in {run / 'record.json'} is not the config the run was made with" in err
    assert f"sha256 is now {edited[:12]}..." in err
    assert f"the record's config_sha256 is {record['config_sha256'][:12]}..." in err
    assert "fix: restore the run's record.json" in err and "--set eval.KEY=VALUE" in err
    _edit_record(run, lambda r: r["config"]["eval"].update(max_new_tokens=4))
    result = run_eval(run, out=run.parent / "e", overrides=["eval.max_new_tokens=2"])
    assert result.record["run"]["config_sha256"] == record["config_sha256"]
    assert result.record["generation"]["max_new_tokens"] == 2


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda r: r["outputs"]["adapter_files"].pop("adapter_model.safetensors"),
            "outputs.adapter_files does not list it",
        ),
        (
            lambda r: r["outputs"].update(adapter_sha256="0" * 64),
            "outputs.adapter_sha256 is 000000000000...",
        ),
    ],
    ids=["weights-unlisted", "two-weights-hashes"],
)
def test_a_record_that_does_not_name_its_adapter_weights_is_refused(
    run: Path, capsys: pytest.CaptureFixture[str], edit: Any, expected: str
) -> None:
    """outputs.adapter_files without adapter_model.safetensors skipped the weights check, wrote the
    eval directory, then the summary failed on a null sha256 (exit 1); now exit 2 before loading,
    nothing written. A listed sha256 other than outputs.adapter_sha256 is refused too."""
    _edit_record(run, edit)
    err = _refused(capsys, run)
    assert "does not name its adapter weights adapter_model.safetensors consistently" in err
    assert expected in err and "fix: restore record.json" in err


def test_the_summary_of_an_eval_record_without_adapter_sha256_says_so() -> None:
    """summary() raised TypeError on an adapter whose sha256 is null."""
    record = {
        "eval_id": "x",
        "base_only": False,
        "adapter": {"sha256": None},
        "split": {"n_rows": 1, "name": "test"},
        "run": {"run_id": "r"},
        "generation": {"decoding": "greedy", "max_new_tokens": 2, "batch_size": 1, "batch_invariant": True},
        "predictions": {"sha256": "0" * 64},
        "tokenizer": {},
        "metrics": {"bleu": 1.0},
    }
    assert "(adapter of no recorded sha256)" in summary(Path("e"), record)


def test_a_damaged_base_model_weights_file_is_refused(
    run: Path, model_restored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """model.safetensors cut in half: a SafetensorError traceback and "internal error" (exit 1);
    now exit 2 naming the file and the fix."""
    weights = model_restored / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    err = _refused(capsys, run)
    assert f"cannot read the model's weights: {weights}: damaged, or not a whole safetensors file" in err
    assert "fix: restore the file" in err


@pytest.mark.parametrize(
    "template",
    ["{% for m in messages %}{{ m['content'] }}", "{{ raise_exception('no system role, please') }}"],
    ids=["unterminated", "raise-exception"],
)
def test_a_broken_chat_template_is_refused(
    run: Path, model_restored: Path, capsys: pytest.CaptureFixture[str], template: str
) -> None:
    """A chat template that does not render, evaluated with --allow-tokenizer-change: a jinja2
    traceback (exit 1); now exit 2 naming the chat template, with the fix."""
    (model_restored / "chat_template.jinja").write_text(template, encoding="utf-8")
    err = _refused(capsys, run, "--allow-tokenizer-change")
    assert "model.name (the tokenizer's chat template): the tokenizer's chat template cannot render" in err
    assert ("no system role, please" if "raise" in template else "Unexpected end of template") in err
    assert "fix: restore the tokenizer files" in err


def _no_model(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model was loaded before the output was checked")


def test_a_file_named_evals_is_refused_before_the_model_loads(
    run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --out, a file RUN_DIR/evals was found after generation; now exit 2 first."""
    monkeypatch.setattr(evaluate_mod, "load_eval_model", _no_model)
    (run / "evals").write_text("not a directory", encoding="utf-8")
    err = _refused(capsys, run)
    assert f"{run / 'evals'} is a file, not a directory" in err
    assert "no --out was given" in err and "--out DIR" in err


def test_an_unwritable_run_directory_is_refused_before_the_model_loads(
    run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --out, a run directory this user cannot write (os.access stands in for the modes:
    root passes them all) is refused before the model loads, naming it."""
    monkeypatch.setattr(evaluate_mod, "load_eval_model", _no_model)
    monkeypatch.setattr(outputs_mod.os, "access", lambda path, mode: Path(path) != run.absolute())
    err = _refused(capsys, run)
    assert f"the directory {run.absolute()} is not writable here" in err and "--out DIR" in err


def test_two_default_evals_of_one_identity_in_one_second_both_land(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second of two evals named alike (one identity, one second) failed after its work with
    "already exists ... choose --out" though no --out was given; now it lands as <id>-2."""
    monkeypatch.setattr(
        evaluate_mod, "new_eval_id", lambda split, identity: f"20250101-000000-{split}-{identity[:8]}"
    )
    first = run_eval(run, max_rows=2)
    second = run_eval(run, max_rows=2)
    assert second.eval_dir == first.eval_dir.with_name(f"{first.eval_dir.name}-2")
    for result in (first, second):
        record = json.loads((result.eval_dir / "eval.json").read_text(encoding="utf-8"))
        assert record["eval_id"] == result.record["eval_id"] == result.eval_dir.name
    assert (first.eval_dir / "predictions.jsonl").read_bytes() == (
        second.eval_dir / "predictions.jsonl"
    ).read_bytes()
    assert sorted(p.name for p in (run / "evals").iterdir()) == [first.eval_dir.name, second.eval_dir.name]


def test_a_default_name_taken_while_the_eval_was_built_gets_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another eval lands on the name between the check and the rename: the next free name is
    taken (and the record says it); an --out taken the same way is refused, nothing left behind."""
    import reprotune._eval.layout as layout_mod
    from reprotune._errors import InputError

    real = layout_mod.write_json_atomic
    final = tmp_path / "evals" / "20250101-000000-test-abcd1234"

    def racing(path: Path, data: Any) -> None:
        if not final.exists():  # another process publishes its eval of the same name meanwhile
            final.mkdir(parents=True)
            (final / "eval.json").write_text("{}", encoding="utf-8")
        real(path, data)

    monkeypatch.setattr(layout_mod, "write_json_atomic", racing)
    record: dict[str, Any] = {"eval_id": final.name}
    landed = layout_mod.publish_eval_dir(final, b"", record, unique=True)
    assert landed.name == record["eval_id"] == f"{final.name}-2"
    assert json.loads((landed / "eval.json").read_text())["eval_id"] == landed.name
    with pytest.raises(InputError, match="an eval never overwrites"):
        layout_mod.publish_eval_dir(final, b"", {"eval_id": "x"}, unique=False)
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name, landed.name]
