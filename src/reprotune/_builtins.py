"""What ``builtin:`` may name in a config: the data and the base model that come with reprotune's
installs (docs/config.md). The config's validation (``_config.schema``), the data loader
(``_data.builtin``) and the model loader (``_model.builtin``, which holds where each model's file
is) take these names from here, so that what a config may name and what loads cannot drift apart.
"""

from __future__ import annotations

from typing import Final

BUILTIN_PREFIX: Final = "builtin:"
#: Names accepted after ``builtin:`` in ``data.path``.
BUILTIN_DATA: Final[tuple[str, ...]] = ("chatterbot-en",)
#: Names accepted after ``builtin:`` in ``model.name``.
BUILTIN_MODELS: Final[tuple[str, ...]] = ("smollm2-135m-instruct",)
