"""A data table's properties, persisted as `<table>/.metatable/table.json`."""
from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa

from metatable import config
from metatable.config import secondary_index_name, secondary_partition
from metatable.errors import ConfigError, InvalidInputError

TABLE_TYPES = ("merge_on_read", "copy_on_write")
METADATA_INDEXES = ("bloom_filter", "column_stats", "record_index")
INDEX_TYPES = ("bucket", "bloom", "record")
BUILDING, READY = "building", "ready"  # the states of a metadata index (`indexer`)
BUCKET_ENGINES = ("simple", "consistent_hashing")
INDEX_SCOPES = ("partition", "global")

KEY_COLUMN = "_mt_record_key"     # stored in every data file
DELETED_COLUMN = "_mt_is_deleted"  # stored in merge-on-read log blocks
RESET_COLUMN = "_mt_resets"  # a write's flag, not stored: the row replaces its key's versions, whatever their order
META_COLUMNS = (KEY_COLUMN, DELETED_COLUMN)
CREATED = ""  # in `TableConfig.schema_versions`, the time of the schema the table was created with


@dataclass(frozen=True)
class IndexConfig:
    """How a write finds a record's file group.

    type "bucket": engine "simple" (hash32(key) % num_buckets, fixed buckets per partition) or
    "consistent_hashing" (num_buckets initial buckets per partition on a hash ring, resized by clustering);
    type "bloom": the metadata-backed bloom index; type "record": the record-level index (`record_index`
    metadata partition: key -> file group), new keys placed as the bloom index places them. `scope`
    "partition" (a key is unique within its partition) or "global" (unique across partitions: an update goes
    to the file group that holds the key).
    """

    type: str = "bucket"
    engine: str = "simple"
    num_buckets: int = 4
    scope: str = "partition"

    def __post_init__(self) -> None:
        if self.type not in INDEX_TYPES:
            raise ConfigError(f"index type must be one of {list(INDEX_TYPES)}, got {self.type!r}")
        if self.type == "bucket" and self.engine not in BUCKET_ENGINES:
            raise ConfigError(f"bucket index engine must be one of {list(BUCKET_ENGINES)}, got {self.engine!r}")
        if not isinstance(self.num_buckets, int) or self.num_buckets < 1:
            raise ConfigError(f"num_buckets must be a positive integer, got {self.num_buckets!r}")
        if self.scope not in INDEX_SCOPES:
            raise ConfigError(f"index scope must be one of {list(INDEX_SCOPES)}, got {self.scope!r}")

    @property
    def consistent_hashing(self) -> bool:
        return self.type == "bucket" and self.engine == "consistent_hashing"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "engine": self.engine, "num_buckets": self.num_buckets, "scope": self.scope}


def _supported(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t)
            or pa.types.is_decimal(t) or pa.types.is_binary(t))


def _nested_supported(t: pa.DataType) -> bool:
    """Lists, structs and maps of stored types (any depth)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _stored(t.value_type)
    if pa.types.is_map(t):
        return _stored(t.key_type) and _stored(t.item_type)
    if pa.types.is_struct(t):
        return t.num_fields > 0 and all(_stored(t.field(i).type) for i in range(t.num_fields))
    return False


def _stored(t: pa.DataType) -> bool:
    return _supported(t) or _nested_supported(t)


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    """The table's storage schema: view and large string types become plain strings, all fields nullable
    (merge-on-read delete markers carry only the key)."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_string_view(t) or pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
            t = pa.binary()
        if not _stored(t):
            raise InvalidInputError(f"column {f.name!r} has type {t}, which metatable does not store yet; "
                                    "supported: integers, floats, booleans, strings, binary, dates, timestamps, "
                                    "decimals, and lists, structs and maps of them")
        if f.name in META_COLUMNS:
            raise InvalidInputError(f"column name {f.name!r} is reserved for metatable")
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)


@dataclass(frozen=True)
class TableConfig:
    schema: pa.Schema
    record_key: tuple[str, ...]
    partition_by: tuple[str, ...] = ()
    ordering_field: str | None = None
    table_type: str = "merge_on_read"
    index: IndexConfig = field(default_factory=IndexConfig)
    metadata_indexes: tuple[str, ...] = ("column_stats",)  # ready: lookups, data skipping and tagging use them
    options: Mapping[str, Any] = field(default_factory=dict)
    building: tuple[str, ...] = ()  # scheduled by the indexer: every commit maintains them, nothing reads them
    # (instant time, schema) of every schema the table has had, oldest first: the one it was created with (time
    # CREATED), then each schema change, named by the instant that made it (valid once that instant completed)
    schema_versions: tuple[tuple[str, pa.Schema], ...] = ()
    # secondary index name -> its columns; its partition (`secondary_index_<name>`) has a state like any index
    secondary_indexes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.schema_versions:
            object.__setattr__(self, "schema_versions", ((CREATED, self.schema),))
        names = set(self.schema.names)
        if not self.record_key:
            raise InvalidInputError("record_key needs at least one column")
        for role, cols in (("record_key", self.record_key), ("partition_by", self.partition_by)):
            missing = [c for c in cols if c not in names]
            if missing:
                raise InvalidInputError(f"{role} columns {missing} are not in the schema ({sorted(names)})")
        if self.ordering_field is not None and self.ordering_field not in names:
            raise InvalidInputError(f"ordering_field {self.ordering_field!r} is not in the schema ({sorted(names)})")
        nested = [c for c in (*self.record_key, *self.partition_by, *([self.ordering_field] if self.ordering_field else [])) if c in names
                  and not _supported(self.schema.field(c).type)]
        if nested:
            raise InvalidInputError(f"columns {nested} are lists, structs or maps: a record key, partition or "
                                    "ordering column must hold plain values")
        if self.table_type not in TABLE_TYPES:
            raise ConfigError(f"table_type must be one of {list(TABLE_TYPES)}, got {self.table_type!r}")
        # checked against the schema where they are declared (a projected config's schema lacks their columns)
        object.__setattr__(self, "secondary_indexes", {name: as_tuple(columns)
                                                       for name, columns in self.secondary_indexes.items()})
        unknown = [m for m in self.maintained if m not in METADATA_INDEXES and secondary_index_name(m) not in
                   self.secondary_indexes]
        if unknown:
            raise ConfigError(f"unknown metadata_indexes {unknown}; valid: {list(METADATA_INDEXES)} and the "
                              "secondary indexes' partitions (secondary_index_<name>)")
        missing = sorted(set(self.required_indexes) - set(self.metadata_indexes))
        if missing:
            raise ConfigError(f"index type {self.index.type!r} needs metadata_indexes {missing}")
        object.__setattr__(self, "options", config.resolve(self.options))

    @property
    def required_indexes(self) -> tuple[str, ...]:
        """The metadata indexes the write index cannot work without."""
        return {"bloom": ("bloom_filter", "column_stats"), "record": ("record_index",)}.get(self.index.type, ())

    @property
    def maintained(self) -> tuple[str, ...]:
        """The metadata indexes every commit writes: ready and building."""
        return (*self.metadata_indexes, *self.building)

    @property
    def written_by_commits(self) -> tuple[str, ...]:
        """The metadata indexes a commit writes: every maintained one but a secondary index still building,
        which the indexer catches up after its build (a commit finds a record's old values in the index's
        reverse entries, which the build has not written yet)."""
        return tuple(p for p in self.maintained if self.secondary_columns(p) is None or p in self.metadata_indexes)

    @property
    def columns_indexed_by_commits(self) -> tuple[str, ...]:
        """The columns of the secondary indexes a commit writes (`written_by_commits`), each once."""
        return tuple(dict.fromkeys(c for p in self.written_by_commits for c in self.secondary_columns(p) or ()))

    def secondary_columns(self, partition: str) -> tuple[str, ...] | None:
        """The columns of the secondary index a metadata partition holds (None: not a secondary index)."""
        name = secondary_index_name(partition)
        return None if name is None else self.secondary_indexes.get(name)

    @property
    def keys_unique_across_partitions(self) -> bool:
        """Whether a record key alone names a record (non-partitioned, or a global index): how the record index
        keys its entries."""
        return not self.partition_by or self.index.scope == "global"

    @property
    def keeps_before_images(self) -> bool:
        """Whether writes keep before-images (`changes.before_images`), on every index and table type."""
        return self.options["changes.before_images"]

    def index_states(self) -> dict[str, str]:
        return {**dict.fromkeys(self.metadata_indexes, READY), **dict.fromkeys(self.building, BUILDING)}

    def with_index_states(self, states: Mapping[str, str]) -> TableConfig:
        return replace(self, metadata_indexes=tuple(p for p, s in states.items() if s == READY),
                       building=tuple(p for p, s in states.items() if s == BUILDING))

    def with_stored(self, stored: Mapping[str, Any]) -> TableConfig:
        """This config with what table.json holds now of what changes while tables are open: the index states
        and the schema versions. Its schema is then the widest, every column of every version (a later
        version's type winning): what a rewrite of data files (compaction, clustering) reads and writes, so it
        drops no column of any file. A snapshot reads with its own version (`as_seen`)."""
        versions = ((CREATED, self.schema_versions[0][1]),
                    *sorted((t, decode_schema(b)) for t, b in stored.get("schema_history", {}).items()))
        widest: dict[str, pa.Field] = {}
        for _, schema in versions:
            widest.update((f.name, f) for f in schema)
        states = parse_index_states(stored["metadata_indexes"])
        return replace(self, metadata_indexes=tuple(p for p, s in states.items() if s == READY),
                       building=tuple(p for p, s in states.items() if s == BUILDING),
                       schema=pa.schema(list(widest.values())), schema_versions=versions,
                       secondary_indexes=stored.get("secondary_indexes", {}))

    @cached_property
    def known_columns(self) -> frozenset[str]:
        """Every column a data file of this table may hold: those of every schema version, and the metadata
        columns. A reader refuses others (a damaged footer's column names)."""
        return frozenset(n for _, schema in self.schema_versions for n in schema.names) | frozenset(META_COLUMNS)

    def as_seen(self, visible: Callable[[str], bool]) -> TableConfig:
        """This config with the schema of a snapshot: the newest version whose instant the snapshot sees."""
        schema = next(s for t, s in reversed(self.schema_versions) if t == CREATED or visible(t))
        return self if schema.equals(self.schema) else replace(self, schema=schema)

    def with_schema(self, schema: pa.Schema) -> TableConfig:
        return self if schema.equals(self.schema) else replace(self, schema=schema)

    def reading(self, columns: Iterable[str]) -> TableConfig:
        """This config with only `columns` and those every read of rows needs (the record key's, the partition
        and the ordering columns), in table order: a read through it decodes no other column."""
        ordering = [self.ordering_field] if self.ordering_field else []
        needed = {*columns, *self.record_key, *self.partition_by, *ordering}
        return self.with_schema(pa.schema([f for f in self.schema if f.name in needed]))

    @property
    def added_columns(self) -> frozenset[str]:
        """Columns added since the table was created: a write may leave them out (they are written as nulls),
        as writers that predate a column do."""
        return frozenset(self.schema.names) - frozenset(self.schema_versions[0][1].names)

    @property
    def merge_on_read(self) -> bool:
        return self.table_type == "merge_on_read"

    @cached_property
    def storage_schema(self) -> pa.Schema:
        """Columns of a base file: the table's, then the record key. Cached: a read asks for it per column."""
        return self.schema.append(pa.field(KEY_COLUMN, pa.string(), nullable=False))

    @cached_property
    def log_schema(self) -> pa.Schema:
        return self.storage_schema.append(pa.field(DELETED_COLUMN, pa.bool_(), nullable=False))

    @property
    def log_encoding(self) -> tuple[str, str]:
        """How a log block of this table is written: its format and that format's codec."""
        block_format = self.options["write.log.block_format"]
        return block_format, self.options["write.log.compression" if block_format == "arrow"
                                          else "write.parquet.compression"]

    def stats_columns(self) -> list[str]:
        """Columns with column_stats: the record key, then the first `column_stats.max_columns` primitive ones."""
        primitive = [f.name for f in self.schema if not pa.types.is_nested(f.type)]
        return [KEY_COLUMN] + primitive[:self.options["column_stats.max_columns"]]

    def metadata_partitions(self) -> dict[str, int]:
        """The metadata table's partitions and their file-group counts."""
        names = ("files", *self.maintained, *(("hashing_meta",) if self.index.consistent_hashing else ()))
        return {p: config.file_groups(p, self.options) for p in names}

    def to_json(self) -> str:
        overridden = {k: v for k, v in self.options.items() if v != config.OPTIONS[k].default}
        return json.dumps({
            "format_version": 1,
            "schema": encode_schema(self.schema_versions[0][1]),
            "schema_history": {t: encode_schema(schema) for t, schema in self.schema_versions[1:]},
            "record_key": list(self.record_key), "partition_by": list(self.partition_by),
            "ordering_field": self.ordering_field, "table_type": self.table_type,
            "index": self.index.to_json(), "metadata_indexes": self.index_states(),
            "secondary_indexes": {name: list(columns) for name, columns in self.secondary_indexes.items()},
            "options": overridden,
        }, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, options: Mapping[str, Any] | None = None) -> TableConfig:
        d = json.loads(text)
        schema = decode_schema(d["schema"])
        states = parse_index_states(d["metadata_indexes"])
        return cls(schema=schema, record_key=tuple(d["record_key"]), partition_by=tuple(d["partition_by"]),
                   ordering_field=d["ordering_field"], table_type=d["table_type"], index=IndexConfig(**d["index"]),
                   metadata_indexes=tuple(p for p, s in states.items() if s == READY),
                   options={**d["options"], **(options or {})},
                   building=tuple(p for p, s in states.items() if s == BUILDING),
                   secondary_indexes=d.get("secondary_indexes", {})).with_stored(d)


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def check_secondary_indexes(definitions: Mapping[str, Sequence[str]], schema: pa.Schema) -> dict[str, tuple[str, ...]]:
    """Secondary index definitions (name -> columns), checked: a name of lower-case letters, digits and
    underscores; one or more distinct plain columns of the table."""
    if not isinstance(definitions, Mapping):
        raise InvalidInputError(f"secondary_indexes maps an index name to its columns, e.g. "
                                f"{{'by_part': ['l_partkey']}}; got {definitions!r}")
    out = {}
    for name, columns in definitions.items():
        columns = as_tuple(columns)
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_]{1,64}", name):
            raise InvalidInputError(f"secondary index name {name!r}: use 1-64 lower-case letters, digits and _")
        if not columns or len(set(columns)) != len(columns):
            raise InvalidInputError(f"secondary index {name!r} needs one or more distinct columns, got {columns}")
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise InvalidInputError(f"secondary index {name!r}: columns {missing} are not in the table "
                                    f"({schema.names})")
        nested = [c for c in columns if not _supported(schema.field(c).type) or
                  pa.types.is_binary(schema.field(c).type) or pa.types.is_large_binary(schema.field(c).type)]
        if nested:
            raise InvalidInputError(f"secondary index {name!r}: columns {nested} are lists, structs, maps or "
                                    "binary; a secondary index holds plain values")
        out[name] = columns
    return out


def secondary_partitions(definitions: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(secondary_partition(name) for name in definitions)


def parse_index_states(stored: Mapping[str, str] | Sequence[str]) -> dict[str, str]:
    """Metadata index -> state as table.json stores it (a plain list: all ready, as tables before the indexer)."""
    return dict(stored) if isinstance(stored, Mapping) else dict.fromkeys(stored, READY)


def as_tuple(cols: str | Sequence[str] | None) -> tuple[str, ...]:
    if cols is None:
        return ()
    return (cols,) if isinstance(cols, str) else tuple(cols)
