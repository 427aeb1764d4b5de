"""The `metatable` command line."""
from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
from typing import Any, Sequence

from .errors import InvalidInputError, MetatableError, TableNotFoundError
from .metadata_table import DEFAULT_FILE_GROUPS, MetadataTable
from .timeline import META_DIR, Timeline
from .storage import LocalStorage

log = logging.getLogger("metatable.cli")


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=_json_default))


def open_metadata(path: str) -> MetadataTable:
    """A data table's metadata table (PATH/.metatable/metadata) or a standalone one at PATH."""
    attached = os.path.join(path, META_DIR, "metadata")
    if os.path.exists(os.path.join(attached, META_DIR, "properties.json")):
        return MetadataTable.open(attached, authority=Timeline(LocalStorage(), path))
    return MetadataTable.open(path)


def timeline_root(path: str) -> str:
    if not os.path.isdir(os.path.join(path, META_DIR)):
        raise TableNotFoundError(f"no metatable table at {path} (no {META_DIR} directory)")
    return path


def cmd_timeline(args: argparse.Namespace) -> None:
    tl = Timeline(LocalStorage(), timeline_root(args.path))
    instants = tl.instants()
    if not instants:
        print("(empty timeline)")
    for i in instants:
        print(f"{i.time}  {i.action.value:<14} {i.state.value}")


def cmd_metadata_create(args: argparse.Namespace) -> None:
    partitions = dict(DEFAULT_FILE_GROUPS)
    if args.partitions:
        partitions = {}
        for item in args.partitions.split(","):
            name, _, n = item.partition("=")
            partitions[name] = int(n) if n else DEFAULT_FILE_GROUPS.get(name, 1)
    MetadataTable.create(args.path, partitions)
    print(f"created metadata table {args.path} with partitions "
          + ", ".join(f"{p} ({n} file groups)" for p, n in partitions.items()))


def cmd_metadata_put(args: argparse.Namespace) -> None:
    try:
        record = json.loads(args.record)
    except ValueError as e:
        raise InvalidInputError(f"RECORD is not JSON: {e}") from None
    mdt = open_metadata(args.path)
    print(f"committed {args.partition}/{args.key} at {mdt.commit({args.partition: {args.key: record}})}")


def cmd_metadata_delete(args: argparse.Namespace) -> None:
    mdt = open_metadata(args.path)
    print(f"deleted {args.partition}/{args.key} at {mdt.commit({args.partition: {args.key: None}})}")


def cmd_metadata_get(args: argparse.Namespace) -> None:
    record = open_metadata(args.path).get(args.partition, args.key)
    if record is None:
        print(f"{args.partition}/{args.key}: not found", file=sys.stderr)
        raise SystemExit(1)
    _print_json(record)


def cmd_metadata_scan(args: argparse.Namespace) -> None:
    count = 0
    for key, record in open_metadata(args.path).scan(args.partition, args.prefix):
        print(key + "\t" + json.dumps(record, sort_keys=True, default=_json_default))
        count += 1
        if args.limit and count >= args.limit:
            break
    print(f"({count} records)", file=sys.stderr)


def cmd_metadata_compact(args: argparse.Namespace) -> None:
    mdt = open_metadata(args.path)
    report = mdt.compact(force=args.force)
    if report.instant:
        print(f"compacted {len(report.file_groups)} file groups at {report.instant}: {report.records} records "
              f"in {report.seconds:.2f}s")
        clean = mdt.clean()
        if clean.instant:
            print(f"cleaned {len(clean.deleted)} old files at {clean.instant}")
    else:
        print("nothing to compact" + ("" if args.force else " (use --force to compact below the threshold)"))
    for why in report.blocked:
        print(f"blocked: {why}")


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_metadata_demo

    os.makedirs(args.workdir, exist_ok=True)
    run_metadata_demo(args.workdir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metatable", description="Keyed tables indexed by a metadata table.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("timeline", help="list a table's instants")
    p.add_argument("path")
    p.set_defaults(func=cmd_timeline)

    p = sub.add_parser("demo", help="the main job: a metatable session on local files")
    p.add_argument("--workdir", default="demo-data")
    p.set_defaults(func=cmd_demo)

    md = sub.add_parser("metadata", help="inspect or use a metadata table").add_subparsers(dest="mdcommand",
                                                                                            required=True)
    p = md.add_parser("create", help="create a standalone metadata table")
    p.add_argument("path")
    p.add_argument("--partitions", help="name[=file_groups],... (default: all four kinds)")
    p.set_defaults(func=cmd_metadata_create)
    p = md.add_parser("put", help="commit one record (JSON) under a key")
    p.add_argument("path")
    p.add_argument("partition")
    p.add_argument("key")
    p.add_argument("record")
    p.set_defaults(func=cmd_metadata_put)
    p = md.add_parser("delete", help="commit a tombstone for a key")
    p.add_argument("path")
    p.add_argument("partition")
    p.add_argument("key")
    p.set_defaults(func=cmd_metadata_delete)
    p = md.add_parser("get", help="one merged record")
    p.add_argument("path")
    p.add_argument("partition")
    p.add_argument("key")
    p.set_defaults(func=cmd_metadata_get)
    p = md.add_parser("scan", help="merged records by key prefix, in key order")
    p.add_argument("path")
    p.add_argument("partition")
    p.add_argument("--prefix", default="")
    p.add_argument("--limit", type=int, default=0)
    p.set_defaults(func=cmd_metadata_scan)
    p = md.add_parser("compact", help="compact due file groups, then clean")
    p.add_argument("path")
    p.add_argument("--force", action="store_true", help="compact every file group with logs")
    p.set_defaults(func=cmd_metadata_compact)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args.func(args)
    except MetatableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
