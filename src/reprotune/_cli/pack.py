"""``reprotune pack RUN_DIR -o run.tar.gz [--with-data]``: a reproduction bundle of a run."""

from __future__ import annotations

import argparse

from reprotune._cli._options import path_value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=path_value, help="a completed run directory")
    parser.add_argument(
        "-o",
        "--out",
        type=path_value,
        required=True,
        help="the bundle to write (.tar.gz); an existing file there is replaced only if it is a bundle",
    )
    parser.add_argument(
        "--with-data",
        action="store_true",
        help="put the data file in the bundle, checked against the run's record (otherwise its hashes "
        "only: `rerun` then asks for --data); builtin data is never packed: every reprotune has it",
    )
    parser.add_argument(
        "--checkpoints",
        action="store_true",
        help="also pack the run's checkpoints (each verified), so that `reprotune verify BUNDLE --spot` "
        "can replay intervals of the run on another machine",
    )
    parser.add_argument(
        "--allow-secrets",
        action="store_true",
        help="pack even when the run's code.patch holds a token-shaped string (refused otherwise)",
    )


def run(args: argparse.Namespace) -> int:
    from reprotune._proof.bundle import pack, run_member
    from reprotune._run.layout import CHECKPOINTS

    manifest = pack(
        args.run_dir,
        args.out,
        with_data=args.with_data,
        allow_secrets=args.allow_secrets,
        with_checkpoints=args.checkpoints,
    )
    members = manifest["members"]
    size = sum(int(m["size"]) for m in members.values())
    print(f"bundle {args.out}: {len(members)} files, {size / 1e6:.1f} MB, run {manifest['run_id']}")
    if manifest["data_builtin"]:
        data = f"{manifest['data_builtin']} (ships with reprotune; checked against the manifest on rerun)"
    else:
        data = "included" if manifest["data"] else "not included (rerun needs --data PATH)"
    print(f"  data            {data}")
    inside = run_member(CHECKPOINTS, "")
    checkpoints = sorted({name[len(inside) :].split("/")[0] for name in members if name.startswith(inside)})
    if checkpoints:
        print(f"  checkpoints     {len(checkpoints)} ({', '.join(checkpoints)})")
        print(f"  spot-check it   reprotune verify {args.out} --spot")
    print(f"  rerun it with   reprotune rerun {args.out}")
    return 0
