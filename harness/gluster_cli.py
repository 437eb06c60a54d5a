"""`python -m harness.gluster_cli [--shard 4MB] -- CMD ARGS`: a command run against
a fresh GlusterFS volume ({mount} in its arguments is the mount point), then all of it
removed. For the side-by-side benchmarks on Gluster, and for trying a run by hand."""

from __future__ import annotations

import argparse
import subprocess
import sys

from harness.gluster import GlusterServer, unavailable


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.gluster_cli [--shard 4MB] -- CMD ARGS`: run CMD with a
    fresh volume mounted ({mount} in ARGS is replaced by the mount point), then remove it
    all. E.g. `-- python benchmarks/vs_fio.py --dir {mount}/vs_fio --repeat 3`."""
    ap = argparse.ArgumentParser(prog="python -m harness.gluster_cli",
                                 description=main.__doc__)
    ap.add_argument("--bricks", type=int, default=2)
    ap.add_argument("--shard", default=None,
                    help="shard block size (e.g. 4MB, Gluster's minimum); default: no sharding")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more `gluster volume set` options")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("a command to run is required (after --)")
    reason = unavailable()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    options = dict(kv.split("=", 1) for kv in args.set)
    with GlusterServer() as server:
        server.create_volume("bench", args.bricks, args.shard, options)
        mount = server.mount("bench")
        print(f"gluster: volume bench ({args.bricks} bricks, shard {args.shard or 'off'}) "
              f"on {mount.path}", file=sys.stderr, flush=True)
        cmd = [a.replace("{mount}", str(mount.path)) for a in command]
        return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
