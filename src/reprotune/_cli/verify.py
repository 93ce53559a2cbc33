"""``reprotune verify CONFIG``: reference, rerun, resume and negative controls; one verdict."""

from __future__ import annotations

import argparse
import datetime as _dt
from pathlib import Path

from reprotune._cli._options import add_set_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="experiment config (YAML)")
    add_set_option(parser)
    parser.add_argument(
        "--out", type=Path, default=None, help="verification directory (default: runs/verify-<id>)"
    )
    parser.add_argument(
        "--control-seed",
        default="data_order",
        help="the derived seed the negative control perturbs (default: data_order)",
    )
    parser.add_argument("--no-resume", action="store_true", help="skip the resume leg and its control")
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="use this completed run of the same config as the reference instead of running one",
    )


def run(args: argparse.Namespace) -> int:
    from reprotune._config.loading import load_config
    from reprotune._config.schema import config_sha256
    from reprotune._proof.verify import verify_config

    cfg = load_config(args.config, args.overrides)
    out = args.out
    if out is None:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"verify-{stamp}-{config_sha256(cfg)[:8]}"
    result = verify_config(
        cfg, out, control_seed=args.control_seed, resume=not args.no_resume, reference=args.reference
    )
    print(result.format())
    print(f"verification record: {out / 'verification.json'}")
    return 0 if result.verdict == "PASS" else 1
