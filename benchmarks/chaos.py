"""Everything at once, with kills: writers, services and a reader on one table, each a process of its own,
one of them SIGKILLed every few seconds and started again. What must hold, and is checked:

- no acknowledged write is lost, and a write killed before its acknowledgement is all or nothing: the final
  table equals a model that applies every write that committed (found by its `Txn` in the commit metadata,
  acknowledged or not), in completion order;
- no key is stored twice, none appears that no writer wrote, and `fsck` finds the table healthy after the
  last recovery (`rollback`);
- every snapshot the reader reads is consistent (no duplicate key, no row a writer never wrote, instants
  never going back), and where no commit landed between the snapshot and them, `get` and `lookup` of
  sampled keys (present and absent) equal the snapshot; where the secondary index on `v` is ready (the
  indexers of `mor-bucket` and `cow-consistent-hashing` build and drop it), `get_by` of sampled values as of
  the snapshot finds exactly its rows with them;
- the change records between two settled snapshots the reader read, the net ones (`changes(start, end)`) and
  every version (`every_version=True`), each applied to the first in order, give the second: with
  before-images and change files kept by the writes (`changes.before_images`, in the configurations that set
  it) and without;
- writers fail only with the conflicts the README documents, at most 5% of their attempts; no stretch of
  30 seconds passes without an acknowledged write. Beside that bound the longest stretch without a completed
  write (`max_commit_gap_s`, from the timeline) is reported: where the acknowledgements stalled and the commits
  did not, writers were killed after committing (in the services after a commit), not held up by the table.

One JSON line per configuration (commits, kills by role, failures by kind, the checks); exit 1 when a check
fails. `make test` runs a short version of each configuration (tests/test_chaos.py).

    python benchmarks/chaos.py [--seconds 600] [--configs mor-bucket,mor-consistent-hashing,cow-bloom,mor-record,
                                                          mor-consistent-hashing-churn,cow-consistent-hashing]
        [--tables s3://bucket/prefix]   # the tables on an object store (AWS_* variables), journals local
        [--seed 7]                       # of the kill schedule
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402
from metatable.errors import ConflictError, IndexingAborted, InvalidInputError, SnapshotExpiredError  # noqa: E402
from metatable.read.changes import settled_end  # noqa: E402
from metatable.timeline.instant import DATA_ACTIONS  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.string()), ("ts", pa.int64())])
# a live process's heartbeat may wait seconds for the CPU where the suite runs this beside another test worker
# on 2 cores (at 0.2 s x 5, writers and the indexer that were alive were rolled back in one fresh-clone run)
OPTIONS = {"heartbeat.interval_s": 0.25, "heartbeat.tolerable_misses": 12, "clean.retain_commits": 4,
           "lock.lease_s": 2.0,  # on an object store, a killed lock holder's lease runs out this soon
           "write.target_file_size": 256 << 10, "clustering.small_file_limit": 128 << 10,
           "clustering.updates": "abort_clustering",  # and a short active timeline, so archivals die too
           "archive.max_instants": 16, "archive.min_instants": 8, "metadata.archive.max_instants": 16,
           "metadata.archive.min_instants": 8}
WRITERS = 3
OWN_KEYS = 400  # writer i mostly writes keys [i * OWN_KEYS, (i + 1) * OWN_KEYS), as a pipeline would
SHARED = range(WRITERS * OWN_KEYS, WRITERS * OWN_KEYS + 100)  # and some keys every writer writes
WRITER_FAILURES = (ConflictError,)  # what the README documents a writer may get (retry)
MAX_FAILED_SHARE = 0.05
MAX_ACK_GAP_S = 30.0
OVERTIME = 6  # a run that did too little (`--min-acks`) goes on for up to this many times its seconds

BY_V = "by_v"  # a secondary index on `v` (a write's rows share theirs) that the indexer builds and drops
SECONDARY = f"secondary_index_{BY_V}"
CONFIGS: dict[str, dict[str, Any]] = {
    "mor-bucket": {"table_type": "merge_on_read", "index": {"num_buckets": 4},
                   "metadata_indexes": ["column_stats"], "indexer": ["bloom_filter", "record_index", SECONDARY],
                   "options": {"changes.before_images": True}},
    "mor-consistent-hashing": {"table_type": "merge_on_read",
                               "index": {"type": "bucket", "engine": "consistent_hashing", "num_buckets": 2},
                               "metadata_indexes": ["column_stats"], "indexer": ["record_index"],
                               "options": {"write.target_file_size": 48 << 10, "changes.before_images": True}},
    # small file groups that split and merge again and again (the one above changes each ring about once)
    "mor-consistent-hashing-churn": {"table_type": "merge_on_read",
                                     "index": {"type": "bucket", "engine": "consistent_hashing", "num_buckets": 2},
                                     "metadata_indexes": ["column_stats"], "indexer": ["record_index"],
                                     "options": {"write.target_file_size": 5 << 10, "bucket.split_point": "middle",
                                                 "bucket.split_threshold": 1.5, "bucket.merge_threshold": 1.3,
                                                 "changes.before_images": True},
                                     # a resize waits for no pending compaction in its partition
                                     "pauses": {"compactor": (3.0, 6.0)}},
    # copy-on-write resizes: a write during a pending one gives each child a base of its own instant
    "cow-consistent-hashing": {"table_type": "copy_on_write",
                               "index": {"type": "bucket", "engine": "consistent_hashing", "num_buckets": 2},
                               "metadata_indexes": ["column_stats"], "indexer": ["record_index", SECONDARY],
                               "options": {"write.target_file_size": 2 << 10, "bucket.split_point": "middle",
                                           "bucket.split_threshold": 1.5, "bucket.merge_threshold": 1.3,
                                           "changes.before_images": True}},
    "cow-bloom": {"table_type": "copy_on_write", "index": {"type": "bloom"},
                  "metadata_indexes": ["column_stats", "bloom_filter"], "indexer": ["record_index"],
                  "options": {"changes.before_images": True}},
    "mor-record": {"table_type": "merge_on_read", "index": {"type": "record"},
                   "metadata_indexes": ["column_stats", "record_index"], "indexer": ["bloom_filter"]},
}


def emit(**fields: Any) -> None:
    print(json.dumps({"benchmark": "chaos", **fields}), flush=True)


# -- journals ---------------------------------------------------------------------------------------------
class Journal:
    """A role's append-only record, one JSON line per event, flushed as it is written: a SIGKILL loses at
    most the line being written (readers skip a torn last line)."""

    def __init__(self, path: str) -> None:
        self.out = open(path, "a")

    def write(self, **entry: Any) -> None:
        self.out.write(json.dumps({"t": time.time(), **entry}) + "\n")
        self.out.flush()


def read_journal(path: str) -> list[dict]:
    entries = []
    if not os.path.exists(path):
        return entries
    with open(path) as f:
        for line in f:
            try:
                entries.append(json.loads(line))
            except ValueError:  # the line a kill cut short
                pass
    return entries


# -- roles (each runs in a process of its own until killed) ------------------------------------------------
def table_options(config: dict) -> dict[str, Any]:
    """What every role opens the table with: the run's options and the configuration's own (an option given
    at open wins over the table's: without the configuration's, its file sizes were the run's)."""
    return {**OPTIONS, **config.get("options", {})}


def open_table(path: str, config: dict) -> mt.Table:
    return mt.Table.open(path, options=table_options(config))


def writer(path: str, journal: Journal, index: int, config: dict) -> None:
    done = [e["op"] for e in read_journal(journal.out.name) if "op" in e]
    op = max(done, default=-1) + 1  # a restarted writer goes on with new versions of its Txn
    table = open_table(path, config)
    while True:
        rng = random.Random(index * 1_000_003 + op)
        own = range(index * OWN_KEYS, (index + 1) * OWN_KEYS)
        ids = sorted({rng.choice(SHARED) if rng.random() < 0.15 else rng.choice(own) for _ in range(rng.randint(5, 40))})
        kind = "delete" if rng.random() < 0.15 else "upsert"
        rows = [{"id": i, "p": f"p{i % 3}", "v": f"w{index}-{op}", "ts": time.time_ns()} for i in ids]
        journal.write(op=op, kind=kind, rows=rows)
        data = pa.Table.from_pylist(rows, schema=SCHEMA)
        txn = mt.Txn(f"writer-{index}", op)
        try:
            if kind == "delete":
                result = table.delete(data.select(["id", "p"]), txn=txn)
            else:
                result = table.upsert(data, txn=txn)
            journal.write(op=op, ack=result.instant)
        except WRITER_FAILURES as e:
            journal.write(op=op, failed=type(e).__name__, message=str(e)[:300])
        except Exception as e:  # noqa: BLE001 - an undocumented failure: the run reports it
            journal.write(op=op, failed=type(e).__name__, unexpected=True, message=traceback.format_exc()[-1500:])
        op += 1
        time.sleep(random.uniform(0.1, 0.5))  # ~2 writes a second each: the soak wrote ~1.4 a second in all


def service(path: str, journal: Journal, name: str, config: dict) -> None:
    """Compaction, clustering (or resize), clean or the indexer, again and again."""
    table = open_table(path, config)
    rng = random.Random(os.getpid())
    pause = config.get("pauses", {}).get(name, (0.3, 1.5))
    while True:
        time.sleep(rng.uniform(*pause))
        try:
            if name == "compactor":
                done = table.compact()
            elif name == "clusterer":
                done = table.cluster()
            elif name == "cleaner":
                done = table.clean()
            else:
                done = index_step(table, rng, config["indexer"])
            journal.write(done=done)
        except (ConflictError, IndexingAborted) as e:  # a service may lose to writers; it runs again
            journal.write(lost=type(e).__name__, message=str(e)[:300])
        except Exception as e:  # noqa: BLE001
            journal.write(failed=type(e).__name__, unexpected=True, message=traceback.format_exc()[-1500:])


def index_step(table: mt.Table, rng: random.Random, partitions: list[str]) -> Any:
    """Build a missing index, drop a ready one now and then, or finish a pending build."""
    partition = rng.choice(partitions)
    state = table.indexes().get(partition)
    if state is None:
        if partition == SECONDARY:
            table.schedule_indexing(secondary={BY_V: ["v"]})
        else:
            table.schedule_indexing([partition])
        return table.run_indexing()
    if state == "building":
        return table.run_indexing()
    if rng.random() < 0.3:
        return table.drop_index(partition)
    return None


def reader(path: str, journal: Journal, journals: str, config: dict) -> None:
    table = open_table(path, config)
    previous = ""
    settled: tuple[str, dict] | None = None  # the last settled snapshot read: its instant and rows
    rng = random.Random(os.getpid())
    while True:
        completed = completed_data_instants(table)
        if not completed:
            time.sleep(0.2)
            continue
        instant = completed[-1]
        try:
            snapshot = table.to_arrow(as_of=instant)
        except SnapshotExpiredError:  # a clean overtook the read: the next one is newer
            journal.write(expired=instant)
            continue
        problems = snapshot_problems(snapshot, journals)
        if instant < previous:
            problems.append(f"instants went back: {instant} after {previous}")
        previous = instant
        rows = {(r["p"], r["id"]): r for r in snapshot.to_pylist()}
        present = rng.sample(sorted(rows), min(10, len(rows)))
        absent = [(f"p{i % 3}", i) for i in rng.sample(range(SHARED.stop), 10) if (f"p{i % 3}", i) not in rows]
        wanted = present + absent
        keys = pa.table({"id": pa.array([k[1] for k in wanted], pa.int64()), "p": [k[0] for k in wanted]})
        got = {(r["p"], r["id"]): r for r in table.get(keys).to_pylist()}
        found, explained = table.lookup(keys, explain=True)
        # nothing completed meanwhile (instants may complete out of order: the whole set): get and lookup
        # answer for the same snapshot
        still = completed_data_instants(table) == completed
        if still:
            expected = {k: rows[k] for k in present}
            if got != expected:
                wrong = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
                problems.append(f"get differs from the snapshot as of {instant} for {wrong[:3]}: "
                                f"{[(got.get(k), expected.get(k)) for k in wrong[:2]]}")
            located = {(p, i): f is not None for i, p, f in zip(keys["id"].to_pylist(), keys["p"].to_pylist(),
                                                                 found["file_id"].to_pylist())}
            wrong = sorted(k for k in wanted if located[k] != (k in rows))
            if wrong:
                problems.append(f"lookup through {explained['index']} differs from the snapshot as of {instant} "
                                f"for {[(k, 'located' if located[k] else 'not located') for k in wrong[:3]]}")
        more, settled = changes_problems(table, settled)
        wrong_by, by_value = secondary_problems(table, *settled, rng) if settled is not None else ([], False)
        journal.write(snapshot=instant, rows=len(rows), checked=still, changes=more is not None, secondary=by_value,
                      problems=problems + wrong_by + (more or []))
        time.sleep(rng.uniform(0.05, 0.3))


def secondary_problems(table: mt.Table, instant: str, rows: dict, rng: random.Random) -> tuple[list[str], bool]:
    """Where the secondary index on `v` is ready: `get_by` of some values of the settled snapshot as of
    `instant` (`changes_problems`': it reads the same whenever it is read) and of one no write wrote, as of
    that instant, must find exactly its rows with those values. Returns the problems and whether it
    compared."""
    if table.indexes().get(SECONDARY) != "ready":
        return [], False
    written = sorted({r["v"] for r in rows.values()})  # rows may share a value: sample the distinct ones
    values = rng.sample(written, min(3, len(written))) + ["never written"]
    try:
        got = table.get_by(BY_V, values, as_of=instant).to_pylist()
    except SnapshotExpiredError:
        return [], False
    except InvalidInputError as e:  # dropped (or dropped and scheduled again) since it was listed ready
        if "no secondary index" in str(e) or "still building" in str(e):
            return [], False
        raise
    found = {(r["p"], r["id"]): r for r in got}
    expected = {k: r for k, r in rows.items() if r["v"] in values}
    if found == expected and len(found) == len(got):
        return [], True
    wrong = sorted(k for k in set(found) | set(expected) if found.get(k) != expected.get(k))
    return [f"get_by {values} as of {instant}: {len(got)} rows, {len(expected)} expected; differs for {wrong[:3]}: "
            f"{[(found.get(k), expected.get(k)) for k in wrong[:2]]}"], True


def changes_problems(table: mt.Table, settled: tuple[str, dict] | None
                     ) -> tuple[list[str] | None, tuple[str, dict] | None]:
    """The snapshot as of the settled end (no running write precedes it: it reads the same whenever it is read),
    and the change records since the last one applied to that one: they must give this one. Returns the
    problems (None: nothing compared) and the snapshot to compare the next with."""
    end = settled_end(table.context.view())
    if end is None or (settled is not None and end <= settled[0]):
        return None, settled
    try:
        rows = {(r["p"], r["id"]): r for r in table.to_arrow(as_of=end).to_pylist()}
        if settled is None:
            return None, (end, rows)
        feeds = {mode: table.changes(settled[0], end, every_version=mode == "every version").to_pylist()
                 for mode in ("net", "every version")}
    except SnapshotExpiredError:  # a clean overtook the window: start again from this end
        return None, None
    problems = []
    for mode, feed in feeds.items():
        applied = dict(settled[1])
        for change in feed:
            kind = change.pop("_change_type")
            del change["_commit_instant"], change["_commit_seq"]
            key = (change["p"], change["id"])
            if kind in ("delete", "update_preimage") and applied.get(key) != change:
                problems.append(f"{mode}: {kind} of {key} in ({settled[0]}, {end}] is {change}, the row was "
                                f"{applied.get(key)}")
            if kind == "insert" and key in applied:
                problems.append(f"{mode}: insert of {key} in ({settled[0]}, {end}], which was present")
            if kind == "delete":
                applied.pop(key, None)
            elif kind != "update_preimage":
                applied[key] = change
        if applied != rows:
            wrong = sorted(k for k in set(applied) | set(rows) if applied.get(k) != rows.get(k))
            problems.append(f"{mode}: the changes of ({settled[0]}, {end}] applied give "
                            f"{[applied.get(k) for k in wrong[:2]]} for {wrong[:2]}, the snapshot has "
                            f"{[rows.get(k) for k in wrong[:2]]}")
    return problems, (end, rows)


def completed_data_instants(table: mt.Table) -> list[str]:
    return [i.time for i in table.timeline() if i.is_completed and i.action in DATA_ACTIONS]


def snapshot_problems(snapshot: pa.Table, journals: str) -> list[str]:
    """No key twice; every row one that a writer wrote (its version is journaled before the attempt)."""
    problems = []
    keys = list(zip(snapshot["p"].to_pylist(), snapshot["id"].to_pylist()))
    if len(keys) != len(set(keys)):
        problems.append(f"{len(keys) - len(set(keys))} keys stored twice")
    written: dict[str, set] = {}
    for value, key in zip(snapshot["v"].to_pylist(), keys):
        writer_name, _, op = value.partition("-")
        if writer_name not in written:
            written[writer_name] = {(f"p{r['id'] % 3}", r["id"], f"{writer_name}-{e['op']}")
                                    for e in read_journal(os.path.join(journals, f"writer-{writer_name[1:]}.jsonl"))
                                    if "rows" in e for r in e["rows"]}
        if (*key, value) not in written[writer_name]:
            problems.append(f"row {key} = {value} was never written")
    return problems


def run_role(args: argparse.Namespace) -> None:
    config = CONFIGS[args.config]
    journal = Journal(os.path.join(args.journals, f"{args.role}.jsonl"))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    # each line timed and named by its process: a role's stderr is read beside the others' and the journals
    logging.basicConfig(level=args.log_level, format=f"%(asctime)s.%(msecs)03d {args.role} %(process)d "
                        "%(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.role.startswith("writer-"):
        writer(args.table, journal, int(args.role.split("-")[1]), config)
    elif args.role == "reader":
        reader(args.table, journal, args.journals, config)
    else:
        service(args.table, journal, args.role, config)


# -- the run: start, kill, restart, then check ------------------------------------------------------------
def create(path: str, config: dict) -> None:
    mt.Table.create(path, SCHEMA, ["id"], ["p"], "ts", table_type=config["table_type"],
                    index=mt.IndexConfig(**config["index"]), metadata_indexes=config["metadata_indexes"],
                    options=table_options(config))


def roles(config: dict) -> list[str]:
    services = ["clusterer", "cleaner", "indexer"] + (["compactor"] if config["table_type"] == "merge_on_read" else [])
    return [f"writer-{i}" for i in range(WRITERS)] + services + ["reader"]


def run_config(name: str, seconds: float, workdir: str, kill_every: tuple[float, float],
               tables: str | None = None, seed: int = 7, min_acks: int = 0, log_level: str = "WARNING"
               ) -> dict[str, Any]:
    config = CONFIGS[name]
    base = os.path.join(workdir, name)
    shutil.rmtree(base, ignore_errors=True)
    path = f"{tables}/{name}-{time.time_ns()}" if tables else os.path.join(base, "table")
    journals = os.path.join(base, "journals")
    os.makedirs(journals)
    create(path, config)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), os.environ.get("PYTHONPATH")]))}

    def start(role: str) -> subprocess.Popen:
        log = open(os.path.join(journals, f"{role}.stderr"), "a")
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role, "--config", name,
                                 "--table", path, "--journals", journals, "--log-level", log_level],
                                stdout=log, stderr=log, env=env)

    procs = {role: start(role) for role in roles(config)}
    kills: Counter[str] = Counter()
    crashes: Counter[str] = Counter()
    rng = random.Random(seed)
    began = time.monotonic()
    while time.monotonic() < began + seconds or (
            time.monotonic() < began + seconds * OVERTIME and not enough_done(journals, min_acks)):
        time.sleep(rng.uniform(*kill_every))
        for role, proc in procs.items():  # a role that ended by itself crashed: start it again
            if proc.poll() is not None:
                crashes[role] += 1
                procs[role] = start(role)
        victim = rng.choice(sorted(procs))
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        kills[victim] += 1
        procs[victim] = start(victim)
    for proc in procs.values():
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    result = {"config": name, "seconds": seconds, "ran_s": round(time.monotonic() - began, 1), "kills": dict(kills),
              "crashes": dict(crashes),
              **final_checks(path, journals, config)}
    if crashes:  # a role died by itself: an error it did not expect (its stderr has the traceback)
        result["ok"] = False
        result["crashed"] = {role: tail(os.path.join(journals, f"{role}.stderr")) for role in crashes}
    return result


def enough_done(journals: str, min_acks: int) -> bool:
    """Whether the writers acknowledged `min_acks` writes and the reader compared a snapshot and change
    records: a run goes on past its seconds until then. On a machine that other work keeps busy a short run
    did too little to check: 1 acknowledged write in 15 s beside the suite's benchmarks on 2 cores, 12 alone."""
    acks = sum("ack" in e for i in range(WRITERS) for e in read_journal(os.path.join(journals, f"writer-{i}.jsonl")))
    reads = read_journal(os.path.join(journals, "reader.jsonl"))
    return acks >= min_acks and any("snapshot" in e for e in reads) and any(e.get("changes") for e in reads)


def tail(path: str) -> str:
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    return "\n".join(lines[starts[-1]:] if starts else lines[-20:])[-2500:]


def final_checks(path: str, journals: str, config: dict) -> dict[str, Any]:
    time.sleep(OPTIONS["heartbeat.interval_s"] * (OPTIONS["heartbeat.tolerable_misses"] + 2))  # the dead are dead
    table = open_table(path, config)
    recovered = table.rollback()
    fsck = table.fsck()
    committed: dict[tuple[str, int], tuple[int, str]] = {}
    commits, completions = 0, []
    for instant, meta in table.context.timeline.history(DATA_ACTIONS):  # archived instants too
        commits += 1
        if "txn" in meta:  # a writer's
            committed[(meta["txn"]["app"], meta["txn"]["version"])] = (meta["completed_at"], instant.time)
            completions.append(meta["completed_at"] / 1e9)
    attempts, acked, lost, failures, acks = 0, 0, 0, Counter(), []
    applied: list[tuple[int, str, list[dict]]] = []
    for i in range(WRITERS):
        ops: dict[int, dict] = {}
        for entry in read_journal(os.path.join(journals, f"writer-{i}.jsonl")):
            ops.setdefault(entry["op"], {}).update(entry)
        for op, entry in ops.items():
            attempts += 1
            done = committed.get((f"writer-{i}", op))
            if "ack" in entry:
                acked += 1
                acks.append(entry["t"])
                lost += done is None or done[1] != entry["ack"]
            elif "failed" in entry:
                failures[entry["failed"] + (" (unexpected)" if entry.get("unexpected") else "")] += 1
            if done is not None and "rows" in entry:
                applied.append((done[0], entry["kind"], entry["rows"]))
    model: dict[tuple[str, int], dict] = {}
    for _, kind, rows in sorted(applied, key=lambda a: a[0]):
        for r in rows:
            key = (r["p"], r["id"])
            if kind == "delete":
                model.pop(key, None)
            elif key not in model or r["ts"] >= model[key]["ts"]:
                model[key] = r
    final = table.to_arrow().to_pylist()
    stored = {(r["p"], r["id"]): r for r in final}
    torn_keys = sorted({k for k, v in model.items() if stored.get(k) != v} | (set(stored) - set(model)))
    torn = len(torn_keys)
    services, reads, read_problems = Counter(), Counter(), []
    for name in os.listdir(journals):
        role = name.removesuffix(".jsonl")
        if not name.endswith(".jsonl") or role.startswith("writer-"):
            continue
        for entry in read_journal(os.path.join(journals, name)):
            if role == "reader":
                reads["snapshots"] += "snapshot" in entry
                reads["checked"] += bool(entry.get("checked"))
                reads["expired"] += "expired" in entry
                reads["changes_checked"] += bool(entry.get("changes"))
                reads["secondary_checked"] += bool(entry.get("secondary"))
                reads["problems"] += len(entry.get("problems", []))
                read_problems += entry.get("problems", [])
            else:
                key = "done" if "done" in entry else "lost" if "lost" in entry else "failed"
                services[f"{role} {key}" + (f" {entry['failed']}" if key == "failed" else "")] += 1
    unexpected_messages = [e["message"] for name in sorted(os.listdir(journals)) if name.endswith(".jsonl")
                           for e in read_journal(os.path.join(journals, name)) if e.get("unexpected")]
    unexpected = sum(n for k, n in failures.items() if "unexpected" in k) + \
        sum(n for k, n in services.items() if " failed" in k)
    result = {
        "commits": commits, "attempts": attempts, "acknowledged": acked, "writer_failures": dict(failures),
        "failed_share": round(sum(failures.values()) / max(attempts, 1), 4), "lost": lost, "torn": torn,
        "duplicate_keys": len(final) - len(stored), "rows": len(final), "fsck_healthy": fsck.healthy,
        "torn_rows": [{"model": model.get(k), "stored": stored.get(k)} for k in torn_keys[:5]],
        "fsck_problems": [f"{p.kind} {p.path}" for p in fsck.problems][:5], "recovered": len(recovered),
        "reader": dict(reads), "reader_problems": read_problems[:5], "services": dict(services),
        "max_ack_gap_s": longest_gap(acks), "max_commit_gap_s": longest_gap(completions),
        "unexpected_failures": unexpected, "unexpected": unexpected_messages[:3],
    }
    result["ok"] = (lost == 0 and torn == 0 and result["duplicate_keys"] == 0 and fsck.healthy
                    and reads["problems"] == 0 and unexpected == 0 and acked > 0
                    and result["failed_share"] <= MAX_FAILED_SHARE and result["max_ack_gap_s"] <= MAX_ACK_GAP_S)
    return result


def longest_gap(times: list[float]) -> float:
    """The longest stretch, in seconds, between two consecutive `times` (seconds, in any order)."""
    times = sorted(times)
    return round(max((b - a for a, b in zip(times, times[1:])), default=0.0), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="how long each configuration runs")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {list(CONFIGS)}")
    parser.add_argument("--kill-every", default="2,5", help="seconds between kills: MIN,MAX")
    parser.add_argument("--seed", type=int, default=7, help="of the kill schedule (which role, when)")
    parser.add_argument("--min-acks", type=int, default=0,
                        help=f"go on past --seconds (up to {OVERTIME}x) until the writers acknowledged this many "
                        "writes and the reader compared snapshots and changes")
    parser.add_argument("--workdir", help="where the tables and journals go (default: a temporary directory)")
    parser.add_argument("--tables", help="where the tables go instead: a directory or an s3:// prefix")
    parser.add_argument("--log-level", default="WARNING",
                        help="of the roles' logs, in the journals' .stderr files (INFO: what each write and "
                        "service did, when)")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    parser.add_argument("--journals", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        run_role(args)
        return 0
    workdir = args.workdir or tempfile.mkdtemp(prefix="metatable-chaos-")
    low, high = map(float, args.kill_every.split(","))
    ok = True
    for name in args.configs.split(","):
        result = run_config(name, args.seconds, workdir, (low, high), args.tables, args.seed, args.min_acks,
                            args.log_level)
        emit(**result)
        ok &= result["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
