"""Options shared by the commands that take an experiment config."""

from __future__ import annotations

import argparse


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """``--set key.path=value`` (repeatable), collected in ``args.overrides``."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value, e.g. --set train.max_steps=10 (repeatable)",
    )
