import pytest

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
