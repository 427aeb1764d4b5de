"""The `metatable` command line."""
from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import os
import re
import sys
from importlib.metadata import version
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from metatable import config
from metatable.errors import CorruptFileError, InvalidInputError, MetatableError, TableNotFoundError
from metatable.metadata.table import MetadataTable, metadata_location
from metatable.services.rebuild import restore_properties
from metatable.storage.location import storage_for, table_root
from metatable.storage.paths import TablePaths
from metatable.table import Table
from metatable.table_config import BUCKET_ENGINES, INDEX_SCOPES, INDEX_TYPES, METADATA_INDEXES, TABLE_TYPES, IndexConfig
from metatable.timeline.instant import BOOTSTRAP_TIME, Action
from metatable.timeline.timeline import Timeline
from metatable.write.write_input import is_dataset, pyarrow_dataset

if TYPE_CHECKING:
    import pyarrow.dataset as ds

log = logging.getLogger("metatable.cli")


SECONDARY_HELP = ("a secondary index, name=column[,column...] (repeatable), e.g. by_part=l_partkey: get-by and "
                  "filters with == or in read through it")
MDT_PARTITION_HELP = "metadata partition (files, bloom_filter, column_stats, hashing_meta, record_index)"
AS_OF_HELP = "the snapshot as of a moment: an instant time, or an ISO-8601 time (UTC unless it has an offset)"


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=_json_default))


def open_metadata(path: str) -> MetadataTable:
    """A data table's metadata table (PATH/.metatable/metadata, or the one a rebuild made) or a standalone one
    at PATH."""
    storage, root = storage_for(path), table_root(path)
    attached = metadata_location(storage, TablePaths(root)).metadata
    if storage.exists(attached.properties):
        return MetadataTable.open(attached.root, storage=storage, authority=Timeline(storage, root))
    return MetadataTable.open(root, storage=storage)


def open_timeline(path: str) -> Timeline:
    """The timeline of the table (or standalone metadata table) at PATH."""
    storage, root = storage_for(path), table_root(path)
    paths = TablePaths(root)
    if not storage.exists(paths.table_config) and not storage.exists(paths.properties):
        raise TableNotFoundError(f"no metatable table at {path} (no {paths.table_config})")
    return Timeline(storage, root)


def cmd_timeline(args: argparse.Namespace) -> None:
    tl = open_timeline(args.path)
    instants = tl.instants()
    archived = tl.archived_instants() if args.all else []
    if not instants and not archived:
        print("(empty timeline)")
    for i in archived:
        print(f"{i.time}  {i.action.value:<14} {i.state.value}  (archived)")
    for i in instants:
        print(f"{i.time}  {i.action.value:<14} {i.state.value}")
    if not args.all and tl.archived.until != BOOTSTRAP_TIME:
        print(f"(instants up to {tl.archived.until} are archived: --all lists them)")


def cmd_metadata_create(args: argparse.Namespace) -> None:
    partitions = None
    if args.partitions:
        partitions = {}
        for item in args.partitions.split(","):
            name, _, n = item.partition("=")
            partitions[name] = int(n) if n else config.file_groups(name)
    mdt = MetadataTable.create(args.path, partitions)
    print(f"created metadata table {args.path} with partitions "
          + ", ".join(f"{p} ({n} file groups)" for p, n in mdt.partitions.items()))


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


def cmd_metadata_rebuild(args: argparse.Namespace) -> None:
    try:
        table = Table.open(args.path)
    except CorruptFileError as e:  # the metadata table's properties: made again from the table config
        if not e.path.endswith(os.path.join(".metatable", "properties.json")):
            raise
        restore_properties(args.path)
        table = Table.open(args.path)
    report = table.rebuild_metadata()
    print(f"rebuilt the metadata table of {args.path} as of {report.up_to} in {report.seconds:.2f}s: "
          + ", ".join(f"{p} {n} records" for p, n in report.partitions.items())
          + f"; {report.files} data files listed; the old one is at {report.damaged} (delete it at will)")
    for path in report.missing:
        print(f"missing: {path} (a completed commit added it; restore it from a backup)", file=sys.stderr)


def cmd_fsck(args: argparse.Namespace) -> None:
    report = Table.open(args.path).fsck(repair=args.repair)
    for problem in report.problems:
        print(f"{problem.kind}: {problem.detail}")
    verb = "removed" if report.repaired else "left by dead processes (remove with --repair)"
    for path in report.leftovers:
        print(f"{verb}: {path}")
    print(f"{report.files_checked} data files checked, {len(report.problems)} problems, {len(report.leftovers)} "
          f"leftovers" + (" removed" if report.repaired else ""))
    if not report.healthy:
        raise SystemExit(1)


def cmd_demo(args: argparse.Namespace) -> None:
    from metatable.demo import run_demo

    run_demo(args.workdir, args.scale_factor, args.buckets)


# -- data tables ---------------------------------------------------------------------------------
def input_format(path: str, fmt: str | None) -> str:
    fmt = (fmt or os.path.splitext(path)[1].lstrip(".")).lower()
    if not os.path.exists(path):
        raise InvalidInputError(f"input file {path} does not exist")
    if fmt == "pq":
        return "parquet"
    if fmt in ("jsonl", "ndjson"):
        return "json"
    if fmt not in ("parquet", "csv", "json"):
        raise InvalidInputError(f"unknown input format {fmt!r} for {path}; use --format parquet, csv or json")
    return fmt


def read_input(path: str, fmt: str | None = None, schema: pa.Schema | None = None
               ) -> pa.Table | pa.RecordBatchReader | ds.Dataset:
    """A Parquet file or directory (a dataset) or a CSV file (a reader), streamed by the write in chunks, or a
    JSON-lines file as an Arrow table; the format comes from the extension. CSV columns that the table has
    are read as the table types them (a string column keeps `00123`), not as inferred; a value that does not
    parse is named with its column and row."""
    fmt = input_format(path, fmt)
    try:
        if fmt == "parquet":
            return pyarrow_dataset().dataset(path, format="parquet", partitioning="hive")
        if fmt == "csv":
            types = {f.name: f.type for f in schema} if schema is not None else None
            return pacsv.open_csv(path, convert_options=pacsv.ConvertOptions(column_types=types))
        return as_table_types(pajson.read_json(path), schema)
    except pa.ArrowException as e:
        raise InvalidInputError(f"cannot read {path} as {fmt}: {e}") from None


_DECIMAL = re.compile(r"decimal(?:128|256)?\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_TIMESTAMP = re.compile(r"timestamp\[\s*(s|ms|us|ns)\s*(?:,\s*tz\s*=\s*([^\]]+?)\s*)?\]$")


def as_table_types(data: pa.Table, schema: pa.Schema | None) -> pa.Table:
    """JSON's inferred columns in the table's types where they convert (a date written as "2024-01-31" is
    inferred a string); the write refuses what does not, naming the column."""
    for i, name in enumerate(data.column_names):
        if schema is not None and name in schema.names and data.schema.field(i).type != schema.field(name).type:
            try:
                data = data.set_column(i, name, data[name].cast(schema.field(name).type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
    return data


def parse_schema(text: str) -> pa.Schema:
    """`name:type,...` with types as pyarrow names them: int32, int64, float64, string, bool, date32,
    timestamp[us], timestamp[us, tz=UTC], decimal(12,2). Commas inside brackets do not split columns."""
    fields = []
    for item in re.split(r",(?![^(\[]*[)\]])", text):
        name, _, type_name = item.strip().partition(":")
        type_name = type_name.strip()
        decimal, timestamp = _DECIMAL.match(type_name), _TIMESTAMP.match(type_name)
        try:
            if decimal:
                precision, scale = int(decimal.group(1)), int(decimal.group(2))
                type_ = (pa.decimal128 if precision <= 38 else pa.decimal256)(precision, scale)
            elif timestamp:
                type_ = pa.timestamp(timestamp.group(1), tz=timestamp.group(2))
            else:
                type_ = pa.type_for_alias(type_name)
            fields.append(pa.field(name.strip(), type_))
        except (ValueError, KeyError):
            raise InvalidInputError(f"unknown type {type_name!r} for column {name!r} in --schema") from None
    return pa.schema(fields)


def parse_secondary(items: Sequence[str] | None) -> dict[str, list[str]]:
    out = {}
    for item in items or []:
        name, sep, columns = item.partition("=")
        if not sep or not columns:
            raise InvalidInputError(f"--secondary takes name=column[,column...], got {item!r}")
        out[name] = columns.split(",")
    return out


def parse_options(items: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidInputError(f"--option takes key=value, got {item!r}")
        out[key] = json.loads(value) if value[:1] in "0123456789-tf[{\"" and value not in ("-",) else value
    return out


def cmd_create(args: argparse.Namespace) -> None:
    if bool(args.schema) == bool(args.schema_from):
        raise InvalidInputError("give the schema with exactly one of --schema or --schema-from")
    schema = parse_schema(args.schema) if args.schema else read_input(args.schema_from, args.format).schema
    index = IndexConfig(type=args.index, engine=args.engine, num_buckets=args.buckets, scope=args.scope)
    indexes = args.metadata_index or (["column_stats", "bloom_filter"] if args.index == "bloom" else ["column_stats"])
    table = Table.create(args.path, schema, args.key.split(","),
                         args.partition_by.split(",") if args.partition_by else None, args.ordering,
                         args.type, index, indexes, parse_options(args.option),
                         secondary_indexes=parse_secondary(args.secondary))
    print(f"created {table.config.table_type} table {table.path}: key {list(table.config.record_key)}, "
          f"partitioned by {list(table.config.partition_by) or 'nothing'}, {index.type} index")


def _write(args: argparse.Namespace, operation: str) -> None:
    table = Table.open(args.path, options=parse_options(args.option))
    data: Any = read_input(args.file, args.format, table.schema)
    if args.spark:
        from metatable.spark.session import spark_session
        spark = spark_session()
        data = spark.read.parquet(args.file) if is_dataset(data) else spark.createDataFrame(
            data if isinstance(data, pa.Table) else data.read_all())
    result = table.delete(data) if operation == "delete" else \
        getattr(table, operation)(data, schema_mode=args.schema_mode)
    upserted = f"{result.upserted} upserted, " if result.upserted else ""
    stale = f"{result.stale} lost on {table.config.ordering_field}, " if result.stale else ""
    print(f"{operation} {result.instant}: {result.inserted} inserted, {result.updated} updated, {upserted}{stale}"
          f"{result.deleted} deleted, {result.skipped} skipped, {result.files_written} files in {result.seconds:.2f}s")


def print_rows(table: pa.Table, fmt: str) -> None:
    if fmt == "json":
        for row in table.to_pylist():
            print(json.dumps(row, default=_json_default))
    elif fmt == "csv":
        buf = io.BytesIO()
        pacsv.write_csv(table, buf)
        sys.stdout.write(buf.getvalue().decode())
    else:
        rows = [[("" if v is None else str(v)) for v in r.values()] for r in table.to_pylist()]
        widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(table.column_names)]
        print("  ".join(n.ljust(w) for n, w in zip(table.column_names, widths)))
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)))


def cmd_add_columns(args: argparse.Namespace) -> None:
    table = Table.open(args.path)
    instant = table.add_columns(list(parse_schema(args.columns)))
    print(f"add-columns {instant}: the table's columns are now " if instant else
          "the table has these columns already: ", ", ".join(f"{f.name} {f.type}" for f in table.schema))


def cmd_read(args: argparse.Namespace) -> None:
    reader = Table.open(args.path).to_batches(as_of=args.as_of, read_optimized=args.read_optimized)
    batches, count = [], 0
    for batch in reader:  # file slices are read as they are reached: a limit stops the reading
        batches.append(batch)
        count += batch.num_rows
        if args.limit and count >= args.limit:
            break
    result = pa.Table.from_batches(batches, reader.schema)
    if args.limit:
        result = result.slice(0, args.limit)
    print_rows(result, args.output)
    print(f"({result.num_rows} rows)", file=sys.stderr)


def cmd_config_set(args: argparse.Namespace) -> None:
    stored = Table.open(args.path).set_options(parse_options(args.options))
    print("stored options: " + (", ".join(f"{k}={v}" for k, v in sorted(stored.items())) or "none (all defaults)"))


def cmd_config_show(args: argparse.Namespace) -> None:
    options = Table.open(args.path).config.options
    for name, value in sorted(options.items()):
        default = config.OPTIONS[name].default
        if args.all or value != default:
            print(f"{name} = {value!r}" + ("" if value != default else "  (default)"))


def cmd_compact(args: argparse.Namespace) -> None:
    instant = Table.open(args.path).compact()
    print(f"compacted at {instant}" if instant else "nothing to compact")


def cmd_clean(args: argparse.Namespace) -> None:
    instant = Table.open(args.path, options=parse_options(args.option)).clean()
    print(f"cleaned at {instant}" if instant else "nothing to clean")


def cmd_rollback(args: argparse.Namespace) -> None:
    done = Table.open(args.path).rollback(args.instant, force=args.force)
    for instant, what in done.items():
        print(f"{instant} {what}")
    if not done:
        print("nothing to recover: no failed write or dead service")


def cmd_stats(args: argparse.Namespace) -> None:
    """A summary: totals, the size distribution of the largest partitions, the rings in brief. `--detail`: every
    file group, every partition, every ring."""
    table = Table.open(args.path)
    rows = table.stats()
    empty = pa.table({"partition": pa.array([], pa.string())})
    if args.detail:
        print_rows(pa.Table.from_pylist(rows) if rows else empty, "table")
    partitions = size_distribution(rows, table.config.options["clustering.small_file_limit"])
    print(f"{len(rows)} file groups in {len(partitions)} partitions, {sum(r['base_rows'] for r in rows)} base rows, "
          f"{sum(r['logs'] for r in rows)} pending logs ({sum(r['log_rows'] for r in rows)} rows), "
          f"{sum(r['base_bytes'] + r['log_bytes'] for r in rows) / 2**20:.1f} MiB, "
          f"{sum(p['small'] for p in partitions)} file groups under clustering.small_file_limit")
    shown = partitions if args.detail else sorted(partitions, key=lambda p: -p["max_bytes"])[:SUMMARY_PARTITIONS]
    print("\nfile sizes per partition (base + logs of each file group's latest slice)"
          + ("" if args.detail or len(partitions) <= SUMMARY_PARTITIONS else
             f", the {SUMMARY_PARTITIONS} with the largest file groups of {len(partitions)} (--detail: all)") + ":")
    print_rows(pa.Table.from_pylist(shown) if shown else empty, "table")
    if table.config.index.consistent_hashing:
        rings = table.rings()
        if args.detail:
            print("\nconsistent-hashing rings (hash ranges are (low, high]):")
            print_rows(pa.Table.from_pylist(rings) if rings else empty, "table")
        elif rings:
            counts = sorted(r["buckets"] for r in rings)
            print(f"\nconsistent-hashing rings: {len(rings)} partitions, buckets per partition min {counts[0]}, "
                  f"median {counts[len(counts) // 2]}, max {counts[-1]} (--detail: each ring)")
    if args.plot:
        plot_sizes(table, rows, args.plot)


def plot_sizes(table: Table, rows: list[dict[str, Any]], out: str) -> None:
    """A histogram of file-group sizes now and, after a clustering or resize, just before the latest one."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidInputError("--plot needs matplotlib: pip install 'metatable[plot]'") from None
    series = {"now": rows}
    replaced = [i for i in table.timeline() if i.action is Action.REPLACECOMMIT and i.is_completed]
    earlier = [i.time for i in table.timeline() if i.is_completed and replaced and i.time < replaced[-1].time]
    if earlier:
        series = {f"before {replaced[-1].time}": table.stats(as_of=earlier[-1]), **series}
    target = table.config.options["write.target_file_size"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, stats in series.items():
        sizes = [(r["base_bytes"] + r["log_bytes"]) / target for r in stats]
        ax.hist(sizes, bins=30, alpha=0.6, label=f"{label} ({len(sizes)} file groups)")
    ax.set_xlabel("file group size / write.target_file_size")
    ax.set_ylabel("file groups")
    ax.set_title(f"file group sizes of {table.path}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


def size_distribution(rows: list[dict[str, Any]], small_limit: int) -> list[dict[str, Any]]:
    by_partition: dict[str, list[int]] = {}
    for r in rows:
        by_partition.setdefault(r["partition"], []).append(r["base_bytes"] + r["log_bytes"])
    out = []
    for partition, sizes in sorted(by_partition.items()):
        sizes.sort()
        out.append({"partition": partition, "file_groups": len(sizes), "min_bytes": sizes[0],
                    "median_bytes": sizes[len(sizes) // 2], "max_bytes": sizes[-1],
                    "small": sum(1 for s in sizes if s < small_limit)})
    return out


def cmd_cluster_schedule(args: argparse.Namespace) -> None:
    table = Table.open(args.path, options=parse_options(args.option))
    instant = table.schedule_clustering(sort_columns=split_list(args.sort_columns), partitions=partitions_arg(args),
                                        num_buckets=args.num_buckets)
    print(f"scheduled clustering {instant}" if instant else "nothing to cluster")


def cmd_cluster_run(args: argparse.Namespace) -> None:
    table = Table.open(args.path, options=parse_options(args.option))
    done = table.run_clustering(args.instant, spark=local_spark(args.spark))
    print(f"clustered at {', '.join(done)}" if done else "no pending clustering ran")


def local_spark(wanted: bool) -> Any:
    if not wanted:
        return None
    from metatable.spark.session import spark_session
    return spark_session()


def cmd_index_schedule(args: argparse.Namespace) -> None:
    table = Table.open(args.path, options=parse_options(args.option))
    secondary = parse_secondary(args.secondary)
    instant = table.schedule_indexing(args.partitions, secondary)
    print(f"scheduled indexing {instant} of {', '.join([*args.partitions, *secondary])}; build it with: "
          f"metatable index run {args.path}")


def cmd_index_run(args: argparse.Namespace) -> None:
    if args.nice:
        os.nice(args.nice)  # a background job: writers on the same machine keep their CPU share
    table = Table.open(args.path, options=parse_options(args.option))
    done = table.run_indexing(args.instant, spark=local_spark(args.spark))
    print(f"indexed at {', '.join(done)}" if done else "no pending indexing ran")


def cmd_index_status(args: argparse.Namespace) -> None:
    rows = Table.open(args.path).index_status()
    if not rows:
        print("no metadata indexes")
        return
    print_rows(pa.Table.from_pylist(rows), args.output)


def cmd_index_drop(args: argparse.Namespace) -> None:
    cancelled = Table.open(args.path).drop_index(args.partition)
    print(f"dropped {args.partition}" + (f" (cancelled pending indexing {', '.join(cancelled)})" if cancelled else ""))


def cmd_cluster_show(args: argparse.Namespace) -> None:
    plans = Table.open(args.path).clustering_plans()
    if not plans:
        print("no clusterings")
    for plan in plans:
        total = sum(g["bytes"] for g in plan["groups"])
        extra = f", {plan['num_buckets']} buckets" if plan["num_buckets"] else ""
        sort = f", sorted by {','.join(plan['sort_columns'])}" if plan["sort_columns"] else ""
        print(f"{plan['instant']} {plan['state']}: {plan['strategy']}{extra}{sort}; {len(plan['groups'])} groups, "
              f"{sum(g['slices'] for g in plan['groups'])} file slices, {total:,} bytes"
              + (f" -> {plan['new_files']} files, {plan['rows']} rows" if plan["state"] == "completed" else ""))
        print_rows(pa.Table.from_pylist(plan["groups"]), "table")
        for resize in plan["resizes"]:
            before = resize.get("buckets_before", "?")
            print(f"  resize of {resize['partition']} (ring seq_no {resize['seq_no']}): {before} -> "
                  f"{resize['buckets_after']} buckets")
            for old, children in resize.get("splits", {}).items():
                print(f"    split {old} -> {len(children)}: {', '.join(children)}")
            for child, olds in resize.get("merges", {}).items():
                print(f"    merge {', '.join(olds)} -> {child}")


SUMMARY_PARTITIONS = 10  # partitions `stats` shows without --detail


def split_list(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text is not None else None


def partitions_arg(args: argparse.Namespace) -> list[str] | int | None:
    if args.recent is not None:
        return args.recent
    return split_list(args.partitions)


def key_values(table: Table, texts: Sequence[str]) -> pa.Table:
    """Record key columns from the command line: one value per key, or `v1,v2` (or `f1:v1,f2:v2`) in key order."""
    fields = list(table.config.record_key)
    columns: dict[str, list[Any]] = {f: [] for f in fields}
    for key in texts:
        parts = key.split(",") if len(fields) > 1 else [key]
        if len(parts) != len(fields):
            raise InvalidInputError(f"key {key!r} needs {len(fields)} comma-separated values ({', '.join(fields)})")
        for name, value in zip(fields, parts):
            columns[name].append(value.split(":", 1)[1] if value.startswith(name + ":") else value)
    schema = table.config.schema
    out = {}
    for name, values in columns.items():
        try:
            out[name] = pa.array(values).cast(schema.field(name).type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidInputError(f"a key value for {name!r} does not convert to its type "
                                    f"{schema.field(name).type}: {e}") from None
    return pa.table(out)


def cmd_get(args: argparse.Namespace) -> None:
    table = Table.open(args.path)
    print_rows(table.get(key_values(table, args.keys), as_of=args.as_of), args.output)


def cmd_get_by(args: argparse.Namespace) -> None:
    table = Table.open(args.path)
    columns = table.config.secondary_indexes.get(args.index, ())
    values = [tuple(v.split(",")) if len(columns) > 1 else v for v in args.values]
    result = table.get_by(args.index, values)
    print_rows(result, args.output)
    print(f"({result.num_rows} rows)", file=sys.stderr)


def cmd_changes(args: argparse.Namespace) -> None:
    result = Table.open(args.path).changes(args.since, args.until, every_version=args.every_version)
    print_rows(result.slice(0, args.limit) if args.limit else result, args.output)
    print(f"({result.num_rows} change records)", file=sys.stderr)


def cmd_lookup(args: argparse.Namespace) -> None:
    table = Table.open(args.path)
    result, report = table.lookup(key_values(table, args.keys), explain=True, using=args.using, as_of=args.as_of)
    print_rows(result, "table")
    if args.explain:
        print(f"\nindex: {report['index']}")
        print_rows(pa.Table.from_pylist(report["levels"]), "table")
        if report["log_candidates"]:
            print(f"keys checked in merge-on-read logs: {report['log_candidates']}")
        print(f"base files read: {report['base_files_read']}, {report['base_bytes_read']:,} bytes")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metatable", description="Keyed tables indexed by a metadata table.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and details")
    verbose = argparse.ArgumentParser(add_help=False)  # -v after the subcommand too
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="log progress and details")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('metatable')}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("timeline", parents=[verbose], help="list a table's instants")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--all", action="store_true", help="the archived instants too, oldest first")
    p.set_defaults(func=cmd_timeline)

    p = sub.add_parser("create", parents=[verbose], help="create a keyed table")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--schema", help="name:type,... (e.g. id:int64,p:string,ts:int64)")
    p.add_argument("--schema-from", help="take the schema of this data file")
    p.add_argument("--format", help="format of --schema-from (default: from its extension)")
    p.add_argument("--key", required=True, help="record key column(s), comma separated")
    p.add_argument("--partition-by", help="partition column(s), comma separated")
    p.add_argument("--ordering", help="ordering field: among versions of a key, the greatest wins")
    defaults = IndexConfig()
    p.add_argument("--type", default=TABLE_TYPES[0], choices=TABLE_TYPES,
                   help="merge_on_read: updates append logs, merged on read; copy_on_write: updates rewrite files")
    p.add_argument("--index", default=defaults.type, choices=INDEX_TYPES,
                   help="how a write finds a key's file group: hashed buckets, the metadata-backed bloom index, or "
                        "the record-level index (record_index)")
    p.add_argument("--engine", default=defaults.engine, choices=BUCKET_ENGINES,
                   help="bucket index: fixed buckets (simple), or a ring whose buckets split and merge")
    p.add_argument("--buckets", type=int, default=defaults.num_buckets,
                   help="buckets per partition (consistent hashing: to start with)")
    p.add_argument("--scope", default=defaults.scope, choices=INDEX_SCOPES,
                   help="bloom and record index: keys unique per partition, or across the table")
    p.add_argument("--metadata-index", action="append", choices=METADATA_INDEXES,
                   help="an index the metadata table keeps (repeatable; default column_stats, plus bloom_filter "
                        "for the bloom index)")
    p.add_argument("--secondary", action="append", help=SECONDARY_HELP)
    p.add_argument("--option", action="append", help="key=value table option (repeatable)")
    p.set_defaults(func=cmd_create)
    for operation in ("upsert", "insert", "bulk_insert", "delete"):
        p = sub.add_parser(operation.replace("_", "-"), parents=[verbose],
                           help=f"{operation.replace('_', ' ')} the rows of a Parquet, CSV or JSON file (streamed)")
        p.add_argument("path", help="the table's directory")
        p.add_argument("file", help="a Parquet, CSV or JSON-lines file" + (" with the key columns" if operation == "delete" else ""))
        p.add_argument("--format", choices=["parquet", "csv", "json"], help="input format (default: from the extension)")
        p.add_argument("--spark", action="store_true", help="write through Spark (local) instead of in-process")
        p.add_argument("--option", action="append", help="key=value option for this write (repeatable), e.g. "
                                                         "write.count_updates=false")
        if operation != "delete":
            p.add_argument("--schema-mode", choices=["merge"], help="merge: add the file's new columns to the table")
        p.set_defaults(func=lambda a, op=operation: _write(a, op))
    p = sub.add_parser("add-columns", parents=[verbose],
                       help="add nullable columns, or widen columns (a wider integer, float to double, decimal "
                            "precision up)")
    p.add_argument("path", help="the table's directory")
    p.add_argument("columns", help="name:type,... as for create --schema (e.g. note:string,qty:int64)")
    p.set_defaults(func=cmd_add_columns)
    p = sub.add_parser("read", parents=[verbose], help="print the table's snapshot")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--limit", type=int, default=20, help="rows to print (0: all)")
    p.add_argument("--output", default="table", choices=["table", "json", "csv"], help="how to print rows")
    p.add_argument("--as-of", help=AS_OF_HELP)
    p.add_argument("--read-optimized", action="store_true", help="base files only (skip unmerged logs)")
    p.set_defaults(func=cmd_read)
    for name, func, text in (("compact", cmd_compact, "compact merge-on-read file groups that have logs"),
                             ("clean", cmd_clean, "delete file slices no retained commit can read")):
        p = sub.add_parser(name, parents=[verbose], help=text)
        p.add_argument("path", help="the table's directory")
        if name == "clean":
            p.add_argument("--option", action="append", help="key=value option for this clean (repeatable), e.g. "
                                                             "clean.retain_commits=5")
        p.set_defaults(func=func)
    p = sub.add_parser("rollback", parents=[verbose], help="recover from dead processes: roll back their writes and clusterings, reset their other services "
                                                          "(they run again), finish their cleans; or one --instant")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--instant", help="this instant only (default: every failed write whose writer is gone)")
    p.add_argument("--force", action="store_true", help="even if its writer still beats")
    p.set_defaults(func=cmd_rollback)
    cl = sub.add_parser("cluster", parents=[verbose], help="clustering: rewrite small file groups into fewer, larger, sorted ones") \
        .add_subparsers(dest="clcommand", required=True)
    p = cl.add_parser("schedule", parents=[verbose], help="plan a clustering (a requested replacecommit); writers keep writing")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--sort-columns", help="comma-separated columns to sort rows by (default: option "
                                          "clustering.sort_columns)")
    p.add_argument("--partitions", help="comma-separated partition paths (default: all)")
    p.add_argument("--recent", type=int, help="only the N most recently written partitions")
    p.add_argument("--num-buckets", type=int, help="simple-bucket table: change the bucket count")
    p.add_argument("--option", action="append", help="key=value option for this run (repeatable)")
    p.set_defaults(func=cmd_cluster_schedule)
    p = cl.add_parser("run", parents=[verbose], help="execute pending clusterings (all, or --instant)")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--instant", help="this pending clustering only (default: every pending one)")
    p.add_argument("--spark", action="store_true", help="one Spark task per group on a local session")
    p.add_argument("--option", action="append", help="key=value option for this run (repeatable)")
    p.set_defaults(func=cmd_cluster_run)
    p = cl.add_parser("show", parents=[verbose], help="pending and completed clusterings with their groups and bytes")
    p.add_argument("path", help="the table's directory")
    p.set_defaults(func=cmd_cluster_show)

    ix = sub.add_parser("index", parents=[verbose], help="the async indexer: build or drop metadata indexes while "
                                                        "writers keep writing").add_subparsers(dest="ixcommand",
                                                                                               required=True)
    p = ix.add_parser("schedule", parents=[verbose], help="plan building indexes (an indexing instant); from now on "
                                                          "every commit maintains them")
    p.add_argument("path", help="the table's directory")
    p.add_argument("partitions", nargs="*", help=f"the metadata indexes to build ({', '.join(METADATA_INDEXES)})")
    p.add_argument("--secondary", action="append", help=SECONDARY_HELP)
    p.add_argument("--option", action="append", help="key=value option (repeatable), e.g. "
                                                     "metadata.record_index.file_groups=8")
    p.set_defaults(func=cmd_index_schedule)
    p = ix.add_parser("run", parents=[verbose], help="build pending indexings (all, or --instant); they become ready")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--instant", help="this pending indexing only (default: every pending one)")
    p.add_argument("--spark", action="store_true", help="one Spark task per data file group on a local session")
    p.add_argument("--nice", type=int, default=19, help="lower this process's CPU priority by N (default 19), so "
                                                        "that writers on the same machine keep theirs; 0 keeps it")
    p.add_argument("--option", action="append", help="key=value option for this run (repeatable), e.g. "
                                                     "indexer.catchup_timeout_s=60")
    p.set_defaults(func=cmd_index_run)
    p = ix.add_parser("status", parents=[verbose], help="each metadata index: state, file groups, records, the "
                                                        "instant it is current to")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--output", default="table", choices=["table", "json", "csv"], help="how to print rows")
    p.set_defaults(func=cmd_index_status)
    p = ix.add_parser("drop", parents=[verbose], help="stop maintaining an index and delete it (writers are never "
                                                      "blocked)")
    p.add_argument("path", help="the table's directory")
    p.add_argument("partition", help="the metadata index to drop (a secondary index's: secondary_index_<name>)")
    p.set_defaults(func=cmd_index_drop)

    p = sub.add_parser("fsck", parents=[verbose], help="check every file the table references (present, readable, "
                                                      "checksums) and its metadata table; exit 1 on a problem")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--repair", action="store_true", help="remove what dead processes left: staging files, markers, "
                                                         "spilled input, files of instants that are gone")
    p.set_defaults(func=cmd_fsck)

    config = sub.add_parser("config", help="a table's stored options").add_subparsers(dest="config_command",
                                                                                      required=True)
    p = config.add_parser("set", parents=[verbose], help="store options for every later open of the table")
    p.add_argument("path", help="the table's directory")
    p.add_argument("options", nargs="+", help="key=value (e.g. clean.retain_commits=20)")
    p.set_defaults(func=cmd_config_set)
    p = config.add_parser("show", parents=[verbose], help="the options that differ from their defaults")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--all", action="store_true", help="every option, defaults too")
    p.set_defaults(func=cmd_config_show)
    p = sub.add_parser("stats", parents=[verbose], help="per partition and bucket: file groups, rows, bytes, pending logs; file sizes; "
                                     "consistent hashing: the rings")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--plot", metavar="PNG", help="draw file group sizes now and before the latest clustering "
                                                 "(needs the 'plot' extra: matplotlib)")
    p.add_argument("--detail", action="store_true", help="every file group, partition and ring, not a summary")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("lookup", parents=[verbose], help="where keys live (record key values; several fields: v1,v2 in key order)")
    p.add_argument("path", help="the table's directory")
    p.add_argument("keys", nargs="+", help="record key values")
    p.add_argument("--explain", action="store_true", help="per-level candidate counts")
    p.add_argument("--using", default="index", choices=["index", "metadata"],
                   help="the table's write index, or the three-level metadata lookup")
    p.add_argument("--as-of", help="where they lived: " + AS_OF_HELP)
    p.set_defaults(func=cmd_lookup)

    p = sub.add_parser("get", parents=[verbose], help="the rows of keys, read through the index (record key values as for lookup)")
    p.add_argument("path", help="the table's directory")
    p.add_argument("keys", nargs="+", help="record key values")
    p.add_argument("--output", default="table", choices=["table", "json", "csv"], help="how to print rows")
    p.add_argument("--as-of", help=AS_OF_HELP)
    p.set_defaults(func=cmd_get)

    p = sub.add_parser("get-by", parents=[verbose], help="the rows whose values are these, through a secondary index")
    p.add_argument("path", help="the table's directory")
    p.add_argument("index", help="the secondary index's name")
    p.add_argument("values", nargs="+", help="a value each (of a composite index: its columns' values, comma "
                                             "separated, or of its first columns)")
    p.add_argument("--output", default="table", choices=["table", "json", "csv"], help="how to print rows")
    p.set_defaults(func=cmd_get_by)

    p = sub.add_parser("changes", parents=[verbose],
                       help="what the writes committed after --since (up to --until) changed: change records")
    p.add_argument("path", help="the table's directory")
    p.add_argument("--since", required=True, help="exclusive: an instant time or an ISO-8601 time")
    p.add_argument("--until", help="inclusive (default: the latest commit that no running write precedes)")
    p.add_argument("--every-version", action="store_true",
                   help="each write's own changes, in order (default: the net change of each record)")
    p.add_argument("--limit", type=int, default=0, help="rows to print (0: all)")
    p.add_argument("--output", default="table", choices=["table", "json", "csv"], help="how to print rows")
    p.set_defaults(func=cmd_changes)

    p = sub.add_parser("demo", parents=[verbose], help="the main job: a metatable session on local files")
    p.add_argument("--workdir", default="demo-data", help="where the TPC-H data and the demo tables go")
    p.add_argument("--scale-factor", type=float, default=float(os.environ.get("SF", "0.1")),
                   help="TPC-H scale factor (default 0.1, or $SF)")
    p.add_argument("--buckets", type=int, default=4, help="buckets per partition")
    p.set_defaults(func=cmd_demo)

    md = sub.add_parser("metadata", parents=[verbose], help="inspect or use a metadata table").add_subparsers(dest="mdcommand",
                                                                                            required=True)
    p = md.add_parser("create", parents=[verbose], help="create a standalone metadata table")
    p.add_argument("path", help="the metadata table's directory")
    p.add_argument("--partitions", help="name[=file_groups],... (default: all four kinds)")
    p.set_defaults(func=cmd_metadata_create)
    p = md.add_parser("put", parents=[verbose], help="commit one record (JSON) under a key")
    p.add_argument("path", help="the metadata table's directory")
    p.add_argument("partition", help=MDT_PARTITION_HELP)
    p.add_argument("key", help="record key")
    p.add_argument("record", help="the record as JSON")
    p.set_defaults(func=cmd_metadata_put)
    p = md.add_parser("delete", parents=[verbose], help="commit a tombstone for a key")
    p.add_argument("path", help="the metadata table's directory")
    p.add_argument("partition", help=MDT_PARTITION_HELP)
    p.add_argument("key", help="record key")
    p.set_defaults(func=cmd_metadata_delete)
    p = md.add_parser("get", parents=[verbose], help="one merged record")
    p.add_argument("path", help="the metadata table's directory")
    p.add_argument("partition", help=MDT_PARTITION_HELP)
    p.add_argument("key", help="record key")
    p.set_defaults(func=cmd_metadata_get)
    p = md.add_parser("scan", parents=[verbose], help="merged records by key prefix, in key order")
    p.add_argument("path", help="the metadata table's directory")
    p.add_argument("partition", help=MDT_PARTITION_HELP)
    p.add_argument("--prefix", default="", help="only keys starting with this")
    p.add_argument("--limit", type=int, default=0, help="records to print (0: all)")
    p.set_defaults(func=cmd_metadata_scan)
    p = md.add_parser("rebuild", parents=[verbose], help="rebuild a data table's metadata table from its data files "
                                                         "and completed timeline, and swap it in")
    p.add_argument("path", help="the data table's directory")
    p.set_defaults(func=cmd_metadata_rebuild)
    p = md.add_parser("compact", parents=[verbose], help="compact due file groups, then clean")
    p.add_argument("path", help="the metadata table's directory")
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
    except BrokenPipeError:  # `metatable read ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush stays quiet too
    return 0


if __name__ == "__main__":
    sys.exit(main())
