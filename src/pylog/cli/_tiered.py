"""``pylog tier [URL]`` and ``pylog restore URL DIR``: tiered storage from the command line.

``tier`` uploads the sealed segments of every topic with ``remote_storage_enable`` in the log directory
(``--dir``) to the object store at URL and prints what each partition uploaded (``Log.tier()``).

``restore`` rebuilds a new log directory DIR from the object store at URL and prints the offsets of every
restored partition; DIR must not exist or be empty (see :mod:`pylog.tiered.restore`).

Object-store options (an S3 endpoint, a region, credentials) are ``--option KEY=VALUE``
(:func:`pylog.cli._common.store_options`), as for every command that opens a log. The usual ``AWS_*``
environment variables work too.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

import pylog
from pylog.cli._common import Output, Parents, UsageError, described, log_dir, store_options
from pylog.tiered.location import read_remote_storage
from pylog.tiered.restore import restore as restore_log

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers

__all__ = ["register"]

_TIER_HELP = """\
Upload to the object store at URL the sealed segments (never the active one) of every topic with
remote_storage_enable=true, with their indexes, and publish a new manifest per partition naming them; then
print what each partition uploaded. URL is s3://bucket/prefix or file:///path; a second run uploads only
what is new.

Without URL, the store recorded in the log directory is used. --roll first rolls the active segment of every
tiered partition holding records, so everything written so far is uploaded (before a device shuts down).

Object-store options (an S3 endpoint, a region, credentials) are --option KEY=VALUE (repeatable); the usual
AWS_* environment variables work too. Options are never written to disk.

On disk: records URL in the log directory (the file remote_storage), so that later opens and commands tier
to the same store. Nothing is deleted, locally or in the store: retention does that.

Exit status: 0 done (also when no topic has remote_storage_enable); 1 the store cannot be reached or
refused a write, URL or an --option is invalid, or the log directory cannot be opened; 2 a usage error (an
--option without '=', no URL given and none recorded)."""

_RESTORE_HELP = """\
Rebuild a new log directory DIR from the object store at URL: the topics, their partition counts and
configs, and every segment its newest manifest names (what was tiered), each object checked against its
recorded size and CRC-32C. Prints the offsets of every restored partition.

DIR must not exist, or be empty. The restore is staged in a hidden directory beside DIR and moved into
place only when complete: a failed restore leaves no DIR behind. Nothing in the object store is changed.

Object-store options are --option KEY=VALUE (repeatable), as for 'pylog tier'.

URL must hold a pylog log: one that holds nothing pylog wrote (a mistyped bucket or prefix) is an error and
nothing is created, unless --allow-empty (an empty log is then made).

Exit status: 0 restored; 1 DIR is not empty, URL holds no pylog log, the store cannot be read, or an object
fails its check; 2 a usage error."""


def register(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "tier",
        parents=parents.base,
        help="upload sealed segments of remote_storage_enable topics to URL",
        **described(_TIER_HELP),
    )
    p.add_argument(
        "url",
        metavar="URL",
        nargs="?",
        help="object store, e.g. s3://bucket/prefix or file:///mnt/shared/log (default: the one recorded)",
    )
    p.add_argument(
        "--roll",
        action="store_true",
        help="roll the active segment of every tiered partition holding records first: upload everything",
    )
    p.set_defaults(func=tier)

    p = sub.add_parser(
        "restore",
        parents=parents.json_only,
        help="rebuild a new log directory from an object store",
        **described(_RESTORE_HELP),
    )
    p.add_argument("url", metavar="URL", help="object store the log was tiered to")
    p.add_argument("target", metavar="DIR", help="new log directory (must not exist, or be empty)")
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="make an empty log when URL holds no pylog log (else that is an error: a mistyped URL)",
    )
    p.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="object-store option, e.g. endpoint=http://127.0.0.1:9000 region=us-east-1 allow_http=true",
    )
    p.set_defaults(func=restore)


def tier(args: argparse.Namespace) -> int:
    out = Output(args)
    path = log_dir(args, store=True)
    if "://" in path:
        raise UsageError(f"tier uploads a log directory; --dir {path} is an object store")
    if args.url is None and read_remote_storage(os.path.abspath(path)) is None:
        raise UsageError(f"{path} records no object store: give its URL (pylog tier URL)")
    with pylog.open(
        path, remote_storage=args.url, remote_storage_options=store_options(getattr(args, "option", None))
    ) as log:
        url = log.remote_storage
        results = log.tier(roll=args.roll)
    rows = [
        {
            "topic": r.topic,
            "partition": r.partition,
            "uploaded": len(r.uploaded),
            "uploaded_bytes": sum(s.size for s in r.uploaded),
            "manifest_version": r.manifest.version,
            "remote_end_offset": r.manifest.log_end_offset,
        }
        for r in results
    ]
    if out.json:
        out.document({"url": url, "partitions": rows})
    elif not rows:
        out.line("no topic has remote_storage_enable=true: nothing to tier")
    else:
        out.table(list(rows[0]), [list(row.values()) for row in rows])
    return 0


def restore(args: argparse.Namespace) -> int:
    out = Output(args)
    report = restore_log(
        args.url,
        args.target,
        remote_storage_options=store_options(args.option),
        allow_empty=args.allow_empty,
    )
    rows = [
        {
            "topic": tp.topic,
            "partition": tp.partition,
            "log_start_offset": r.log_start_offset,
            "last_offset": r.log_end_offset - 1 if r.log_end_offset > r.log_start_offset else None,
            "log_end_offset": r.log_end_offset,
            "segments": r.segments,
        }
        for tp, r in sorted(report.items())
    ]
    if out.json:
        out.document({"url": args.url, "target": args.target, "partitions": rows})
    elif not rows:
        out.line(f"restored an empty log into {args.target}: the store holds no remote manifest of a topic")
    else:
        out.table(list(rows[0]), [list(row.values()) for row in rows], title=f"restored into {args.target}")
    return 0
