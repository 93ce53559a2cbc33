"""``reprotune verify CONFIG``: reference, rerun, resume and negative controls; one verdict."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
from pathlib import Path
from typing import TYPE_CHECKING

from reprotune._cli._options import add_set_option, path_value, pin_cpu_isa_of_bundle, pin_cpu_isa_of_run
from reprotune._errors import InputError
from reprotune._run.outputs import refuse_inside_run, refuse_unwritable_parent

if TYPE_CHECKING:
    from reprotune._proof.verification import Verification

_USAGE_FIX = 'run `reprotune verify CONFIG` or `reprotune verify --command "python train.py ..."`'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        type=path_value,
        nargs="?",
        default=None,
        help="experiment config (YAML); with --spot, the run directory to check; not with --command",
    )
    add_set_option(parser)
    parser.add_argument(
        "--out", type=path_value, default=None, help="verification directory (default: runs/verify-<id>)"
    )
    parser.add_argument(
        "--control-seed",
        default=None,
        help="the derived seed the negative control perturbs (default: data_order; not with --command "
        "or --spot)",
    )
    parser.add_argument("--no-resume", action="store_true", help="skip the resume leg and its control")
    parser.add_argument(
        "--thorough",
        action="store_true",
        help="full-length legs (rerun, seed control, resume, RNG-skip control) instead of the fast ones",
    )
    parser.add_argument(
        "--reference",
        type=path_value,
        default=None,
        help="use this completed run of the same config as the reference instead of running one",
    )
    parser.add_argument(
        "--command",
        dest="train_command",
        default=None,
        metavar="COMMAND",
        help='verify your own Trainer script instead of a config: "python train.py ..." (its Trainer '
        "needs reprotune's ReprotuneCallback; docs/integrations.md)",
    )
    parser.add_argument(
        "--spot",
        action="store_true",
        help="check the existing run RUN_DIR by replaying sampled intervals between its checkpoints "
        "(always the first and the last) for a fraction of its cost",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="with --spot: the share of the run's steps to replay (default 0.2)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="with --spot: the seed that draws the intervals (recorded; default 0)",
    )
    parser.add_argument(
        "--allow-code-drift",
        action="store_true",
        help="with --spot: replay even when the code here differs from the run's (said, and noted)",
    )
    parser.add_argument(
        "--resume-at",
        type=int,
        default=None,
        metavar="STEP",
        help="with --command: also stop a run after STEP and resume it with the Trainer's own "
        "resume_from_checkpoint",
    )


def run(args: argparse.Namespace) -> int:
    from reprotune._run.signals import interrupt_on_signals

    with interrupt_on_signals():  # SIGTERM/SIGHUP as Ctrl-C: the legs are stopped, exit 128 + signal
        return _run(args)


def _refuse_several_nodes(world: int) -> None:
    """verify's legs are ``torchrun --standalone`` launches on rank 0's node, at the world size of
    verify's own launch: a launch over several nodes cannot be made again that way."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) != world:
        raise InputError(
            f"verify runs under torchrun over several nodes here (LOCAL_WORLD_SIZE={local}, "
            f"WORLD_SIZE={world}): its legs are launches on one node",
            source="torchrun",
            fix="run verify on one node (`torchrun --standalone --nproc_per_node N -m reprotune verify "
            "...`), or check the multi-node run with `reprotune rerun` under a launch like its own",
        )


def _run(args: argparse.Namespace) -> int:
    rank = None
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:  # under torchrun, as a run decides it
        from reprotune._train.distributed import launch_variables  # torch: a torchrun launch has it

        rank, world, _ = launch_variables("verify")  # a stale TORCHELASTIC_RUN_ID: refused by name
        _refuse_several_nodes(world)
    if rank is not None and (args.spot or args.train_command is not None):
        form = "--spot" if args.spot else "--command"
        raise InputError(
            f"verify {form} runs under torchrun here: every rank would run it and write the same --out",
            source=form,
            fix="run verify itself without torchrun ("
            + (
                "a --command that trains under torchrun names torchrun in its command"
                if form == "--command"
                else "--spot replays runs made in one process"
            )
            + ")",
        )
    if args.spot:
        return _run_spot(args)
    spot_only = {
        "--budget": args.budget,
        "--seed": args.seed,
        "--allow-code-drift": args.allow_code_drift or None,
    }
    given = next((flag for flag, value in spot_only.items() if value is not None), None)
    if given is not None:
        raise InputError(f"{given} goes with --spot", source=given, fix=f"add --spot, or leave {given} out")
    if args.train_command is not None or args.resume_at is not None:
        return _run_command(args)
    from reprotune._config.loading import load_config
    from reprotune._config.schema import config_sha256
    from reprotune._proof.verify import verify_config

    if args.config is None:
        raise InputError("verify needs a config, or --command", source="reprotune verify", fix=_USAGE_FIX)
    if rank:
        return 0  # under torchrun, rank 0 runs the legs, each a fresh torchrun launch of its own
    cfg = load_config(args.config, args.overrides)
    out = args.out
    if out is None:
        out = _default_out("verify", config_sha256(cfg)[:8])
    if out.exists() and not out.is_dir():  # e.g. --out CONFIG: never written over (issue 16)
        raise InputError(
            f"--out {str(out)!r} is a file, not a directory", source="--out", fix="give a new directory"
        )
    refuse_unwritable_parent(out, source="--out")
    refuse_inside_run(out, option="--out")
    result = verify_config(
        cfg,
        out,
        control_seed=args.control_seed or "data_order",
        resume=not args.no_resume,
        reference=args.reference,
        thorough=args.thorough,
    )
    return _done(result, out)


def _run_command(args: argparse.Namespace) -> int:
    """``verify --command``: the user's own Trainer script (``_proof.verify_command``)."""
    from reprotune._proof.verify_command import verify_command

    if args.train_command is None:
        raise InputError("--resume-at needs --command", source="--resume-at", fix=_USAGE_FIX)
    config_only = args.overrides or args.reference is not None or args.thorough or args.no_resume
    if args.config is not None or config_only or args.control_seed is not None:
        raise InputError(
            "--command verifies a script, not a config: a config, --set, --reference, --thorough, "
            "--no-resume or --control-seed cannot go with it (its resume leg is --resume-at STEP)",
            source="--command",
            fix=_USAGE_FIX,
        )
    out = args.out
    if out is None:
        out = _default_out("verify", _command_digest(args.train_command))
    refuse_unwritable_parent(out, source="--out")
    refuse_inside_run(out, option="--out")
    return _done(verify_command(args.train_command, out, resume_at=args.resume_at), out)


def _run_spot(args: argparse.Namespace) -> int:
    """``verify RUN_DIR --spot``: replay sampled checkpoint intervals (``_proof.spot``)."""
    from reprotune._proof.intervals import DEFAULT_BUDGET
    from reprotune._run.outputs import removed_if_refused

    if args.train_command is not None and not (args.config or args.overrides or args.reference):
        return _run_command_spot(args)
    others = args.train_command or args.overrides or args.reference or args.thorough or args.no_resume
    if args.config is None or others or args.resume_at is not None or args.control_seed is not None:
        raise InputError(
            "--spot checks an existing run: give its run directory, and none of --command, --set, "
            "--reference, --thorough, --no-resume, --resume-at, --control-seed",
            source="--spot",
            fix="run `reprotune verify RUN_DIR --spot [--budget 0.2] [--seed N]`",
        )
    out = args.out
    if out is None:
        out = _default_out("verify-spot", Path(args.config).name)
    budget = DEFAULT_BUDGET if args.budget is None else args.budget
    drift, seed = args.allow_code_drift, args.seed or 0
    target = Path(args.config)
    if target.suffix in (".yaml", ".yml") and target.is_file():
        raise InputError(
            f"{target} is a config; --spot checks a run that exists: its run directory or bundle",
            source="--spot",
            fix=f"run it first (`reprotune run {target}`), then `reprotune verify RUN_DIR --spot`; or "
            f"verify the config in full: `reprotune verify {target}`",
        )
    refuse_unwritable_parent(out, source="--out")  # as verify's other forms, before the run is read
    if not target.is_dir() and not target.is_file():
        raise InputError(
            f"{target} is neither a run directory nor a bundle file: "
            + ("nothing is there" if not target.exists() else "it is another kind of file"),
            source="--spot",
            fix="give the directory `reprotune run` wrote (runs/<run-id>/, which holds record.json), or a "
            "bundle of it: `reprotune pack RUN_DIR -o run.tar.gz --checkpoints --with-data`",
        )
    # (an --out inside the run checked is refused by the spot check itself, saying it reads there)
    # The replays inherit the mode the run was made in, put in force before torch loads here.
    if target.is_file():
        pin_cpu_isa_of_bundle(target)
    else:
        pin_cpu_isa_of_run(target, trainer_runs=False)  # spot refuses those: run the script
    from reprotune._proof.spot import spot_verify, spot_verify_bundle

    with removed_if_refused(out):
        if target.is_file():  # a bundle packed with --checkpoints
            result = spot_verify_bundle(target, out, budget=budget, seed=seed, allow_code_drift=drift)
        else:
            result = spot_verify(target, out, budget=budget, seed=seed, allow_code_drift=drift)
    return _done(result, out)


def _done(result: Verification, out: Path) -> int:
    """Print the verdict, put it on the reference's tracker run; the exit code (0 PASS, 1 FAIL)."""
    from reprotune._proof.verdict_tags import tag_reference
    from reprotune._run.layout import VerifyLayout

    verification = VerifyLayout(out).verification
    print(result.format())
    print(f"verification record: {verification}")
    tag_reference(result, verification, report=print)
    return 0 if result.verdict == "PASS" else 1


def _run_command_spot(args: argparse.Namespace) -> int:
    """``verify --command "..." --spot``: the Trainer's own checkpoints (``_proof.spot_command``)."""
    from reprotune._proof.intervals import DEFAULT_BUDGET
    from reprotune._proof.spot_command import spot_verify_command

    others = args.thorough or args.no_resume or args.resume_at is not None or args.allow_code_drift
    if others or args.control_seed is not None:
        raise InputError(
            "--command --spot takes --budget, --seed and --out only",
            source="--spot",
            fix='run `reprotune verify --command "python train.py ..." --spot [--budget 0.2]`',
        )
    out = args.out
    if out is None:
        out = _default_out("verify-spot", _command_digest(args.train_command))
    refuse_unwritable_parent(out, source="--out")  # as verify --command's own checks
    refuse_inside_run(out, option="--out")
    budget = DEFAULT_BUDGET if args.budget is None else args.budget
    return _done(spot_verify_command(args.train_command, out, budget=budget, seed=args.seed or 0), out)


def _default_out(prefix: str, key: str) -> Path:
    """``runs/<prefix>-<UTC time>-<key>``: where a verification goes without ``--out``."""
    return Path("runs") / f"{prefix}-{_dt.datetime.now(_dt.UTC):%Y%m%d-%H%M%S}-{key}"


def _command_digest(command: str) -> str:
    import hashlib

    return hashlib.sha256(command.encode()).hexdigest()[:8]
