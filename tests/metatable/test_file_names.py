import pytest
from hypothesis import given, strategies as st

from metatable.errors import InvalidInputError
from metatable.file_group.base_file import BaseFile
from metatable.formats.log_file import LogFile

ids = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True)
tokens = st.from_regex(r"[A-Za-z0-9-]{1,20}", fullmatch=True)
times = st.from_regex(r"\d{17}", fullmatch=True)


@given(ids, tokens, times)
def test_base_file_round_trip(file_id, token, instant):
    b = BaseFile(file_id, token, instant, "parquet")
    assert BaseFile.parse(b.file_name) == b


@given(ids, times, st.integers(1, 10**6), tokens)
def test_log_file_round_trip(file_id, base, version, token):
    lf = LogFile(file_id, base, version, token)
    assert lf.file_name.startswith(".")
    assert LogFile.parse(lf.file_name) == lf


@pytest.mark.parametrize("bad", ["nope", "a_b.parquet", ".x_1.log.1_t"])
def test_bad_names(bad):
    with pytest.raises(InvalidInputError):
        BaseFile.parse(bad) if not bad.startswith(".") else LogFile.parse(bad)
