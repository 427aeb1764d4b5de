import pyarrow as pa
import pytest

import metatable as mt
from metatable import config
from metatable.errors import ConfigError


def test_defaults_and_overrides():
    resolved = config.resolve({"metadata.compact.max_delta_commits": 3})
    assert resolved["metadata.compact.max_delta_commits"] == 3
    assert resolved["metadata.clean.retain_file_slices"] == config.OPTIONS["metadata.clean.retain_file_slices"].default


def test_unknown_option_lists_valid_ones():
    with pytest.raises(ConfigError) as e:
        config.resolve({"metadata.compact.max_delta_comits": 3})
    assert "max_delta_comits" in str(e.value) and "metadata.compact.max_delta_commits" in str(e.value)


@pytest.mark.parametrize("value", ["3", 0, 2.5, True])
def test_bad_values(value):
    with pytest.raises(ConfigError, match="max_delta_commits"):
        config.resolve({"metadata.compact.max_delta_commits": value})


def test_set_options_persists_for_later_opens_and_refuses_what_it_must(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), pa.schema([("id", pa.int64())]), "id")
    other = mt.Table.open(t.path)
    assert t.set_options({"clean.retain_commits": 4, "compaction.mode": "schedule"}) == \
        {"clean.retain_commits": 4, "compaction.mode": "schedule"}
    assert t.config.options["clean.retain_commits"] == 4  # this object reopened
    assert other.config.options["clean.retain_commits"] == 10  # an open handle keeps its own until it reopens
    assert mt.Table.open(t.path).config.options["compaction.mode"] == "schedule"
    assert mt.Table.open(t.path, options={"clean.retain_commits": 6}).config.options["clean.retain_commits"] == 6
    before = (tmp_path / "t" / ".metatable" / "table.json").read_text()
    for bad in ({"nope": 1}, {"compaction.mode": "sometimes"}, {"metadata.record_index.file_groups": 8}):
        with pytest.raises(ConfigError):
            t.set_options(bad)
    assert (tmp_path / "t" / ".metatable" / "table.json").read_text() == before
