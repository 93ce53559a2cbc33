"""Every path that differs between the library versions reprotune supports, in one place.

pyproject.toml declares ranges (transformers 4.56+ and 5.x, torch 2.8+, ...); CI proves the lock
and the floors (``reprotune/stacks/lock.txt`` and ``floor.txt``). Where an older release spells
something differently, the difference is handled here and nowhere else, so that dropping a
version is deleting a branch in this file.
"""

from __future__ import annotations

import inspect
from functools import cache
from pathlib import Path
from typing import Any

from reprotune._jsonio import read_json_object


@cache
def transformers_major() -> int:
    """The major version of the installed transformers (4 or 5)."""
    import transformers

    return int(transformers.__version__.split(".", 1)[0])


def load_tokenizer(directory: Path) -> Any:
    """``AutoTokenizer.from_pretrained(directory)``, offline.

    transformers 5 saves a fast tokenizer as ``tokenizer_class: TokenizersBackend``, a class 4.x
    does not have; 4.x then loads the same ``tokenizer.json`` as ``PreTrainedTokenizerFast``
    (the class 5.x's backend replaced), so a folder saved by either version loads in both (the
    converted builtin model is cached once per machine and shared by every environment).
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # trust_remote_code never None: transformers would ask on stdin whether to run the
    # directory's own code, and a "y" runs it.
    cls: Any = AutoTokenizer
    if transformers_major() < 5 and _saved_tokenizer_class(directory) == "TokenizersBackend":
        cls = PreTrainedTokenizerFast
    return cls.from_pretrained(directory, local_files_only=True, trust_remote_code=False)


def _saved_tokenizer_class(directory: Path) -> str | None:
    found = read_json_object(directory / "tokenizer_config.json").get("tokenizer_class")
    return found if isinstance(found, str) else None


def sampling_strategy(args: Any) -> str:
    """The order a Trainer draws its rows in: transformers 5's ``train_sampling_strategy``
    ("random", "group_by_length", "batch_rebalance"); 4.x has only ``group_by_length=True``."""
    strategy = getattr(args, "train_sampling_strategy", None)
    if strategy is not None:
        return str(strategy)
    return "group_by_length" if getattr(args, "group_by_length", False) else "random"


def ddp_no_buffer_sync() -> dict[str, Any]:
    """The DistributedDataParallel keyword that stops its buffer broadcasts from rank 0.

    torch 2.13 renamed ``broadcast_buffers`` (deprecated there) to ``forward_sync_buffers``; from
    2.7 (where ``init_sync`` appeared) both mean "no buffer broadcast before a forward", and with
    ``init_sync=False`` neither broadcasts at construction.
    """
    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}
