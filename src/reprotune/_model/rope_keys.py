"""The rotary keys of a ``config.json``, which transformers 4 and 5 write and read otherwise.

transformers 5 writes a model's rotary base inside ``rope_parameters``; transformers 4 does not
know that key (it keeps it as an unused attribute) and reads ``rope_theta``, falling back to its
default (10000 for Llama). The same files then make two models: other rotary frequencies, other
numbers from the first forward on. Found comparing the quickstart on the lock's stack and the
floors' (docs/microscope.md, section 4). No torch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from reprotune._jsonio import read_json_object, write_json_atomic

log = logging.getLogger(__name__)


def _nested_only(config: dict[str, Any]) -> dict[str, Any] | None:
    """``rope_parameters`` when it is the only place ``config`` gives the rotary base, else None."""
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" in config or "rope_theta" not in rope:
        return None
    return rope


def portable_rope_config(path: Path) -> bool:
    """Give a ``config.json`` that transformers 5 wrote the rotary keys transformers 4 reads.

    transformers 5 writes the rotary base inside ``rope_parameters``; transformers 4 does not know
    that key and reads the same file as its default base (10000 for Llama, where SmolLM2's is
    100000): another model from the same files. With ``rope_theta`` (and ``rope_scaling``) beside
    it, every supported version computes the same rotary frequencies (shown in
    tests/proof/test_cross_stack.py). A file that has them, or no ``rope_parameters``, is left as
    it is.

    Returns:
        Whether the file was rewritten.
    """
    config = read_json_object(path)
    rope = _nested_only(config)
    if rope is None:
        return False
    config["rope_theta"] = rope["rope_theta"]
    if "rope_scaling" not in config:
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        config["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    try:
        write_json_atomic(path, config, indent=2)
    except OSError as exc:  # a read-only or shared cache: the load goes on with the file as it is
        log.warning(
            "could not add rope_theta to %s (%s): transformers 4 reads another rotary base", path, exc
        )
        return False
    return True


def rope_misread(config_path: Path, config: Any) -> tuple[str, str] | None:
    """What the loaded ``config`` computes otherwise than ``config_path`` gives, and the fix; or None.

    The file gives the rotary base only as ``rope_parameters.rope_theta`` and the loaded config's
    own ``rope_theta`` (transformers 4's) is another value: the model is not the one saved.
    """
    rope = _nested_only(read_json_object(config_path))
    if rope is None:
        return None
    in_force = getattr(config, "rope_theta", None)
    if in_force is None or in_force == rope["rope_theta"]:
        return None
    what = (
        f"{config_path} gives the rotary base as rope_parameters.rope_theta = {rope['rope_theta']}, a key "
        f"this transformers does not read: the model computes with rope_theta {in_force} (its default), "
        "not the model that was saved (by transformers 5)"
    )
    fix = (
        f'add "rope_theta": {rope["rope_theta"]} beside rope_parameters in config.json, or use transformers 5'
    )
    return what, fix


def rope_read_otherwise(config_path: Path, config: Any) -> str | None:
    """:func:`rope_misread` in one sentence, as ``load_base_model`` warns it."""
    misread = rope_misread(config_path, config)
    return None if misread is None else "; ".join(misread)
