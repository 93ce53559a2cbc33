"""``reprotune doctor [CONFIG] [--json] [--set KEY=VALUE]``: audit a setup for reproducibility.

Exit 1 when an error-level finding exists, 0 otherwise, 2 for bad input (an invalid config).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reprotune._cli._options import add_set_option, path_text, pin_cpu_isa


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add doctor's arguments to its subparser."""
    parser.add_argument(
        "config", nargs="?", type=path_text, help="experiment config (YAML); default: audit the defaults"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_set_option(parser)
    parser.add_argument(
        "--code-dir",
        default=".",
        metavar="DIR",
        help="directory whose git state is checked (default: the current directory)",
    )
    parser.add_argument("--no-probe", action="store_true", help="skip the empirical forward/backward probe")


def run(args: argparse.Namespace) -> int:
    """Run the audit and print the report; return 1 if an error-level finding exists, else 0."""
    from reprotune._config.loading import config_from_dict, load_config
    from reprotune._errors import InputError
    from reprotune._jsonio import canonical_dumps

    if not Path(args.code_dir).is_dir():
        what = "is a file" if Path(args.code_dir).exists() else "does not exist"
        raise InputError(
            f"--code-dir {args.code_dir!r} {what}: it names the directory whose git state is checked",
            source="--code-dir",
            fix="give the directory of the code the run uses (default: the current directory)",
        )
    if args.config is not None:
        config = load_config(args.config, args.overrides)
        source = args.config
    elif args.overrides:
        config = config_from_dict({}, source="--set", overrides=args.overrides, check_paths=True)
        source = "default config with --set"
    else:
        config, source = None, None
    if config is not None:
        pin_cpu_isa(config.determinism.cpu_isa)  # before torch loads
    from reprotune._doctor.doctor import run_doctor
    from reprotune._doctor.findings import format_report

    report = run_doctor(
        config if args.config is not None else None,  # None: the defaults, with any --set applied
        config_source=source,
        code_dir=args.code_dir,
        probe=not args.no_probe,
        overrides=args.overrides,
    )
    if args.json:
        sys.stdout.write(canonical_dumps(report.to_dict()))
    else:
        print(format_report(report))
    return report.exit_code
