"""The `metatable` command, end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from metatable.cli import main


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def files(tmp_path):
    (tmp_path / "in.csv").write_text("id,p,v,ts\n1,a,x,1\n2,a,y,1\n3,b,z,1\n")
    (tmp_path / "up.json").write_text('{"id": 1, "p": "a", "v": "X", "ts": 2}\n{"id": 4, "p": "b", "v": "new", "ts": 1}\n')
    (tmp_path / "del.csv").write_text("id,p\n2,a\n")
    return tmp_path


def test_table_session(capsys, files):
    t = str(files / "t")
    code, out, _ = run(capsys, "create", t, "--schema-from", str(files / "in.csv"), "--key", "id",
                       "--partition-by", "p", "--ordering", "ts", "--buckets", "2")
    assert code == 0 and "created merge_on_read table" in out
    assert run(capsys, "upsert", t, str(files / "in.csv"))[1].startswith("upsert")
    code, out, _ = run(capsys, "upsert", t, str(files / "up.json"))
    assert "1 inserted, 1 updated" in out
    code, out, _ = run(capsys, "delete", t, str(files / "del.csv"))
    assert "1 deleted" in out
    code, out, err = run(capsys, "read", t, "--output", "json", "--limit", "0")
    rows = sorted((json.loads(line) for line in out.splitlines()), key=lambda r: r["id"])
    assert [(r["id"], r["v"]) for r in rows] == [(1, "X"), (3, "z"), (4, "new")]
    code, out, _ = run(capsys, "get", t, "1", "2", "4", "--output", "json")
    assert sorted((json.loads(line)["id"], json.loads(line)["v"]) for line in out.splitlines()) == [(1, "X"), (4, "new")]
    assert "(3 rows)" in err
    code, out, _ = run(capsys, "read", t, "--output", "csv")
    assert out.splitlines()[0] == '"id","p","v","ts"'
    code, out, _ = run(capsys, "lookup", t, "1", "2", "--explain", "--using", "metadata")
    assert code == 0 and "p=a" in out and "3 file check" in out and "base files read: " in out
    code, out, _ = run(capsys, "stats", t)
    assert "pending logs" in out and "p=a" in out
    assert "compacted at" in run(capsys, "compact", t)[1]
    assert run(capsys, "rollback", t)[1] == "nothing to recover: no failed write or dead service\n"
    code, out, _ = run(capsys, "timeline", t)
    assert out.count("deltacommit") == 3 and "compaction" in out
    code, out, _ = run(capsys, "metadata", "scan", t, "files")
    assert "p=a" in out and "__all_partitions__" in out
    code, out, _ = run(capsys, "metadata", "get", t, "files", "p=b")
    assert ".parquet" in out
    code, out, _ = run(capsys, "upsert", t, str(files / "up.json"), "--option", "write.count_updates=false")
    assert "0 inserted, 0 updated, 2 upserted, 0 deleted" in out


def test_cluster_commands(capsys, files):
    t = str(files / "t")
    run(capsys, "create", t, "--schema-from", str(files / "in.csv"), "--key", "id", "--partition-by", "p",
        "--ordering", "ts", "--index", "bloom", "--option", "write.target_file_size=1024")
    for source in ("in.csv", "up.json", "in.csv"):
        run(capsys, "upsert", t, str(files / source))
    code, out, _ = run(capsys, "cluster", "schedule", t, "--sort-columns", "v", "--partitions", "p=a")
    assert code == 0 and out.startswith("scheduled clustering ")
    instant = out.split()[-1]
    code, out, _ = run(capsys, "cluster", "show", t)
    assert f"{instant} requested: size, sorted by v; 1 groups" in out and "p=a" in out
    code, out, _ = run(capsys, "cluster", "run", t, "--instant", instant)
    assert out == f"clustered at {instant}\n"
    code, out, _ = run(capsys, "cluster", "show", t)
    assert f"{instant} completed" in out and "files, " in out
    code, out, _ = run(capsys, "stats", t)
    assert "file sizes per partition" in out and "median_bytes" in out
    code, out, _ = run(capsys, "read", t, "--output", "json", "--limit", "0")
    assert sorted(json.loads(line)["id"] for line in out.splitlines()) == [1, 2, 3, 4]
    code, out, err = run(capsys, "cluster", "schedule", t, "--num-buckets", "4")
    assert code == 2 and "bloom index" in err


def test_resize_commands(capsys, files):
    """A consistent-hashing table: stats shows the rings, cluster show a pending resize's splits, --plot draws
    the sizes before and after."""
    t = str(files / "t")
    rows = "".join(f"{i},a,{'v' * 40}{i},1\n" for i in range(400))
    (files / "many.csv").write_text("id,p,v,ts\n" + rows)
    run(capsys, "create", t, "--schema-from", str(files / "in.csv"), "--key", "id", "--partition-by", "p",
        "--ordering", "ts", "--engine", "consistent_hashing", "--buckets", "2")
    run(capsys, "upsert", t, str(files / "many.csv"))
    code, out, _ = run(capsys, "stats", t)
    assert "consistent-hashing rings: 1 partitions, buckets per partition min 2" in out
    code, out, _ = run(capsys, "stats", t, "--detail")
    assert "consistent-hashing rings" in out and "largest_range" in out
    options = ["--option", "write.target_file_size=1024", "--option", "bucket.split_threshold=1.5"]
    code, out, _ = run(capsys, "cluster", "schedule", t, *options)
    assert code == 0 and out.startswith("scheduled clustering "), out
    instant = out.split()[-1]
    code, out, _ = run(capsys, "cluster", "show", t)
    assert f"{instant} requested: resize" in out and "resize of p=a (ring seq_no 0): 2 ->" in out and "split " in out
    code, out, _ = run(capsys, "cluster", "run", t, "--instant", instant)
    assert out == f"clustered at {instant}\n"
    plot = files / "sizes.png"
    code, out, _ = run(capsys, "stats", t, "--plot", str(plot))
    assert code == 0 and plot.stat().st_size > 1000 and "wrote" in out
    code, out, _ = run(capsys, "read", t, "--output", "json", "--limit", "0")
    assert sorted(json.loads(line)["id"] for line in out.splitlines()) == list(range(400))


@pytest.mark.parametrize("args,message", [
    (["read", "{root}/missing"], "no metatable table"),
    (["upsert", "{root}/t", "{root}/nothere.csv"], "does not exist"),
    (["create", "{root}/x", "--schema", "id:int64,v:wat", "--key", "id"], "unknown type 'wat'"),
    (["create", "{root}/x", "--schema", "id:int64", "--key", "id", "--option", "nope=1"], "unknown option 'nope'"),
    (["metadata", "get", "{root}/t", "record_index", "k"], "unknown metadata partition"),
    (["rollback", "{root}/t", "--instant", "123"], "bad instant time"),
])
def test_errors_are_clear(capsys, files, args, message):
    run(capsys, "create", str(files / "t"), "--schema-from", str(files / "in.csv"), "--key", "id")
    code, out, err = run(capsys, *[a.format(root=files) for a in args])
    assert code == 2 and message in err and "Traceback" not in err


def test_console_script(files):
    exe = os.path.join(os.path.dirname(sys.executable), "metatable")
    result = subprocess.run([exe, "metadata", "create", str(files / "m"), "--partitions", "files"],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "created metadata table" in result.stdout
    result = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("metatable 0.")


def test_csv_columns_take_the_table_types_and_broken_pipes_end_quietly(capsys, files):
    t = str(files / "t")
    (files / "codes.csv").write_text("id,p,v,ts\n1,a,00123,1\n")
    run(capsys, "create", t, "--schema", "id:int64,p:string,v:string,ts:int64", "--key", "id", "--partition-by", "p")
    code, out, err = run(capsys, "upsert", t, str(files / "codes.csv"))
    assert code == 0, err
    code, out, _ = run(capsys, "read", t, "--output", "json")
    assert json.loads(out.splitlines()[0])["v"] == "00123"
    (files / "bad.csv").write_text("id,p,v,ts\n1,a,x,notanumber\n")
    code, _, err = run(capsys, "upsert", t, str(files / "bad.csv"))
    assert code == 2 and "bad.csv" in err and "notanumber" in err
    (files / "many.csv").write_text("id,p,v,ts\n" + "".join(f"{i},a,v{i},1\n" for i in range(5000)))
    run(capsys, "upsert", t, str(files / "many.csv"))
    exe = os.path.join(os.path.dirname(sys.executable), "metatable")
    for fmt in ("table", "json"):
        result = subprocess.run(["bash", "-o", "pipefail", "-c", f"{exe} read {t} --output {fmt} --limit 0 | head -1"],
                                capture_output=True, text=True)
        assert result.returncode == 0 and result.stdout and "Traceback" not in result.stderr, result.stderr


def test_every_flag_has_help_and_verbose_goes_anywhere():
    import argparse

    from metatable.cli import build_parser

    parser = build_parser()
    missing = []

    def walk(p, path):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
            elif not action.help:
                missing.append((path, action.dest))

    walk(parser, [])
    assert not missing
    assert parser.parse_args(["read", "/t", "-v"]).verbose and parser.parse_args(["-v", "read", "/t"]).verbose
    assert not parser.parse_args(["read", "/t"]).verbose


def test_index_commands(capsys, files):
    t = str(files / "t")
    run(capsys, "create", t, "--schema-from", str(files / "in.csv"), "--key", "id", "--partition-by", "p",
        "--ordering", "ts")
    run(capsys, "upsert", t, str(files / "in.csv"))
    code, out, _ = run(capsys, "index", "schedule", t, "record_index", "bloom_filter")
    assert code == 0 and out.startswith("scheduled indexing ") and "metatable index run" in out
    code, out, _ = run(capsys, "index", "status", t, "--output", "json")
    states = {json.loads(line)["partition"]: json.loads(line)["state"] for line in out.splitlines()}
    assert states == {"bloom_filter": "building", "column_stats": "ready", "record_index": "building"}
    run(capsys, "upsert", t, str(files / "up.json"))  # written while building: maintained all the same
    code, out, _ = run(capsys, "index", "run", t)
    assert code == 0 and out.startswith("indexed at ")
    code, out, _ = run(capsys, "index", "status", t, "--output", "json")
    rows = {json.loads(line)["partition"]: json.loads(line) for line in out.splitlines()}
    assert rows["record_index"]["state"] == "ready" and rows["record_index"]["records"] == 4
    code, out, _ = run(capsys, "lookup", t, "1", "4", "9", "--explain")
    assert "record_index" in out and out.count("p=") == 2
    code, out, err = run(capsys, "index", "schedule", t, "record_index")
    assert code != 0 and "record_index is ready" in err
    code, out, _ = run(capsys, "index", "drop", t, "record_index")
    assert out == "dropped record_index\n"
    code, out, _ = run(capsys, "index", "status", t)
    assert "record_index" not in out and "bloom_filter" in out


def test_schema_evolution_commands(capsys, files):
    t = str(files / "t")
    run(capsys, "create", t, "--schema-from", str(files / "in.csv"), "--key", "id", "--ordering", "ts")
    run(capsys, "upsert", t, str(files / "in.csv"))
    code, out, _ = run(capsys, "add-columns", t, "note:string,ts:int64")
    assert code == 0 and out.startswith("add-columns ") and "note string" in out
    assert "has these columns already" in run(capsys, "add-columns", t, "note:string")[1]
    code, _, err = run(capsys, "add-columns", t, "ts:int32")
    assert code != 0 and "not a widening" in err and "Nothing was written" in err
    (files / "more.json").write_text('{"id": 9, "p": "a", "v": "w", "ts": 5, "score": 2.5}\n')
    code, _, err = run(capsys, "upsert", t, str(files / "more.json"))
    assert code != 0 and "schema_mode='merge'" in err
    assert run(capsys, "upsert", t, str(files / "more.json"), "--schema-mode", "merge")[0] == 0
    code, out, _ = run(capsys, "read", t, "--output", "json", "--limit", "0")
    rows = {json.loads(line)["id"]: json.loads(line) for line in out.splitlines()}
    assert rows[9]["score"] == 2.5 and rows[1]["score"] is None and rows[1]["note"] is None


def test_first_day_cli_types_keys_and_options(capsys, files):
    t = str(files / "o")
    code, out, _ = run(capsys, "create", t, "--schema",
                       "id:int64,day:date32,amt:decimal(12,2),at:timestamp[us, tz=UTC],note:string",
                       "--key", "id", "--partition-by", "day")
    assert code == 0
    from metatable import Table
    import pyarrow as pa
    schema = Table.open(t).schema
    assert schema.field("amt").type == pa.decimal128(12, 2) and schema.field("at").type == pa.timestamp("us", "UTC")
    (files / "o.json").write_text('{"id": 1, "day": "2024-01-31", "amt": 2.5, "at": "2024-01-31T10:00:00", '
                                  '"note": "x"}\n{"id": 2, "day": "2024-02-01", "amt": 1, "at": null, "note": null}\n')
    assert run(capsys, "upsert", t, str(files / "o.json"))[0] == 0
    (files / "odel.json").write_text('{"id": 1, "day": "2024-01-31"}\n')  # a date partition, as JSON has it
    assert "1 deleted" in run(capsys, "delete", t, str(files / "odel.json"))[1]
    code, _, err = run(capsys, "get", t, "not-a-number")
    assert code != 0 and "does not convert" in err and "Traceback" not in err
    code, out, _ = run(capsys, "clean", t, "--option", "clean.retain_commits=1")
    assert code == 0 and "clean" in out
    code, _, err = run(capsys, "clean", t, "--option", "clean.nope=1")
    assert code != 0 and "clean.nope" in err


def test_config_set_persists_options_and_stats_summarizes(capsys, files):
    t = str(files / "t")
    run(capsys, "create", t, "--schema-from", str(files / "in.csv"), "--key", "id", "--partition-by", "p",
        "--buckets", "1")
    rows = "".join(f"{i},p{i % 14},v,1\n" for i in range(140))
    (files / "wide.csv").write_text("id,p,v,ts\n" + rows)
    run(capsys, "upsert", t, str(files / "wide.csv"))
    code, out, _ = run(capsys, "config", "set", t, "clean.retain_commits=3", "write.conflict_retries=2")
    assert code == 0 and "clean.retain_commits=3" in out and "write.conflict_retries=2" in out
    from metatable import Table
    assert Table.open(t).config.options["clean.retain_commits"] == 3
    assert run(capsys, "config", "set", t, "clean.retain_commits=10")[0] == 0  # back to the default: not stored
    assert "clean.retain_commits" not in run(capsys, "config", "show", t)[1]
    assert "write.conflict_retries = 2" in run(capsys, "config", "show", t)[1]
    for bad, words in [("clean.nope=1", "unknown option"), ("clean.retain_commits=-1", ">="),
                       ("metadata.files.file_groups=4", "fixed when")]:
        code, _, err = run(capsys, "config", "set", t, bad)
        assert code != 0 and words in err
    code, out, _ = run(capsys, "stats", t)
    assert "14 file groups in 14 partitions" in out and "the 10 with the largest file groups of 14" in out
    assert len(out.splitlines()) < 20
    code, out, _ = run(capsys, "stats", t, "--detail")
    assert all(f"p=p{i}" in out for i in range(14)) and len(out.splitlines()) > 28
