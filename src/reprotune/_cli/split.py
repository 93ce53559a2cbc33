"""``reprotune split DATA --out MANIFEST``: make a frozen, seeded split manifest.

Imports only the standard library at module level; the data and split modules (NumPy, no torch)
are imported when the command runs.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from reprotune._cli._options import RARE_CLASS_POLICIES, add_format_option, path_text
from reprotune._errors import InputError
from reprotune._run.outputs import json_document, refuse_overwrite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's arguments."""
    parser.add_argument(
        "data", type=path_text, metavar="DATA", help="JSONL, CSV or Parquet file, or builtin:chatterbot-en"
    )
    parser.add_argument(
        "--out",
        type=path_text,
        required=True,
        metavar="MANIFEST",
        help="where to write the manifest (JSON); an existing file there is replaced only if it is "
        "a manifest",
    )
    add_format_option(parser)
    parser.add_argument("--stratify-by", metavar="COL", help="keep the proportions of this column's classes")
    parser.add_argument(
        "--group-by", metavar="COL", help="keep all rows sharing this column's value together"
    )
    parser.add_argument(
        "--ratios",
        default="0.8,0.1,0.1",
        help="train,validation,test shares summing to 1 (default 0.8,0.1,0.1)",
    )
    parser.add_argument("--seed", default="0", help="non-negative integer (default 0)")
    parser.add_argument(
        "--rare-class-policy",
        default="train",
        choices=RARE_CLASS_POLICIES,
        help="classes too small for every split: train (keep in train, warn; default), drop, error",
    )


def parse_ratios(text: str) -> tuple[float, float, float]:
    """Parse ``--ratios`` (``"0.8,0.1,0.1"``).

    Raises:
        InputError: not three numbers, negative, or not summing to 1.
    """
    from reprotune._data.split_options import check_ratios

    values = []
    for part in text.split(","):
        try:
            values.append(float(part))
        except ValueError:
            raise InputError(
                f"ratio {part.strip()!r} in {text!r} is not a number",
                source="--ratios",
                fix="give three numbers that sum to 1, e.g. --ratios 0.8,0.1,0.1",
            ) from None
    return check_ratios(values, source="--ratios")


def parse_seed(text: str) -> int:
    """Parse ``--seed``: digits only, so ``-1``, ``1.5`` and ``abc`` are refused, and in
    [0, 2**63), the range of ``seed.root``.

    Raises:
        InputError: not a non-negative integer, or out of range.
    """
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise InputError(
            f"seed {text[:40]!r} is not a non-negative integer",
            source="--seed",
            fix="pass a whole number >= 0, e.g. --seed 42",
        )
    # Length first: int() of thousands of digits is refused by Python itself.
    if len(digits.lstrip("0")) > 19 or int(digits) >= 2**63:
        shown = digits if len(digits) <= 30 else f"{digits[:12]}... ({len(digits)} digits)"
        raise InputError(
            f"seed {shown} is out of range: seeds are in [0, 2**63), as seed.root",
            source="--seed",
            fix="pass a whole number below 9223372036854775808, e.g. --seed 42",
        )
    return int(digits)


def run(args: argparse.Namespace) -> int:
    """Split the data, write the manifest, print a summary. Returns 0."""
    from reprotune._data.loaders import load_table
    from reprotune._data.manifest import write_manifest
    from reprotune._data.split import RareClassWarning, split_table
    from reprotune._formats import SPLIT_MANIFEST

    ratios = parse_ratios(args.ratios)
    seed = parse_seed(args.seed)
    out = Path(args.out)
    if out.is_dir():
        raise InputError(
            f"--out {args.out!r} is a directory", source="--out", fix="give a file path such as split.json"
        )
    refuse_overwrite(out, reads=[args.data], option="--out", own=json_document(SPLIT_MANIFEST))
    table = load_table(args.data, args.format)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RareClassWarning)
        manifest = split_table(
            table,
            ratios=ratios,
            seed=seed,
            stratify_by=args.stratify_by,
            group_by=args.group_by,
            rare_class_policy=args.rare_class_policy,
        )
    for warning in caught:
        print(f"reprotune split: warning: {warning.message}", file=sys.stderr)
    digest = write_manifest(manifest, out)
    print(manifest.summary())
    print(f"wrote {out} (sha256 {digest})")
    return 0
