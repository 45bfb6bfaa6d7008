"""Token ids kept as the JSON text a server sent (polar_cli.proxy.token_json): cut out of a body without parsing,
counted and checked as bytes, and never accepted when they would not read back as non-negative ints."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polar_cli.models.chat import JsonTokenIds
from polar_cli.proxy.token_json import json_ids_count, json_ids_ok, loads_keeping_prompt_ids


def test_a_top_level_array_comes_back_as_text_and_anything_else_is_parsed() -> None:
    data = loads_keeping_prompt_ids(b'{"id":"a","prompt_token_ids":[5,6,7],"usage":{"prompt_tokens":3}}')
    ids = data["prompt_token_ids"]
    assert isinstance(ids, JsonTokenIds) and ids.raw == b"[5,6,7]" and ids._list is None
    assert data["usage"] == {"prompt_tokens": 3}
    nested = b'{"choices":[{"prompt_token_ids":[1,2]}],"prompt_token_ids":[]}'  # the first match is not top-level
    assert loads_keeping_prompt_ids(nested) == orjson.loads(nested)
    only_nested = b'{"choices":[{"prompt_token_ids":[1,2]}]}'
    assert loads_keeping_prompt_ids(only_nested) == orjson.loads(only_nested)
    assert loads_keeping_prompt_ids(b'{"prompt_token_ids":null}') == {"prompt_token_ids": None}


@pytest.mark.parametrize(
    ("raw", "length", "ok"),
    [
        (b"[]", -1, True),
        (b"[0]", -1, True),
        (b"[1,2,3]", -1, True),
        (b"[1,2,3]", 3, True),
        (b"[1,2,3]", 4, False),  # the server's usage says more ids than it sent
        (b"[1,,3]", -1, False),
        (b"[01,2]", -1, False),
        (b"[1,02]", -1, False),
        (b"[0,10,0]", -1, True),
        (b"[1" + b"0" * 400 + b"]", -1, False),  # not an int once read
        (b"[20000000000000000000]", -1, False),
        (b"[,1]", -1, False),
        (b"[1,]", -1, False),
        (b"[1,-2]", -1, False),
        (b"[1,2.5]", -1, False),
        (b'[1,"a"]', -1, False),
        (b"[1, 2, 3]", -1, True),  # whitespace: parsed
        (b"[1, -2]", -1, False),
        (b"[1,2", -1, False),
        (b"{}", -1, False),
        (b"[[1]]", -1, False),
    ],
)
def test_the_text_check(raw: bytes, length: int, ok: bool) -> None:
    ids = JsonTokenIds(raw, length)
    assert json_ids_ok(ids) is ok
    assert ids.checked is ok  # kept: a second look costs nothing
    if ok:
        assert len(ids) == len(orjson.loads(raw)) == json_ids_count(ids)


def test_a_stream_counts_first_and_checks_against_the_servers_count_later() -> None:
    ids = JsonTokenIds(b"[4,5,6,7]")
    assert json_ids_count(ids) == 4 and ids.checked is None and ids.length == -1  # a count, not yet a verdict
    ids.length = 4  # usage.prompt_tokens, from the stream's last chunk
    assert json_ids_ok(ids)
    wrong = JsonTokenIds(b"[4,5,6,7]")
    json_ids_count(wrong)
    wrong.length = 5
    assert not json_ids_ok(wrong)


@given(st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=300))
def test_every_list_of_ids_round_trips(values: list[int]) -> None:
    raw = orjson.dumps(values)
    counted = JsonTokenIds(raw)
    assert json_ids_count(counted) == len(values)
    ids = JsonTokenIds(raw)
    assert json_ids_ok(ids) and len(ids) == len(values) and ids.tolist() == values
    assert json_ids_ok(JsonTokenIds(raw, len(values)))  # with the server's own count


@given(
    st.one_of(
        st.text(alphabet="0123456789,", max_size=30).map(lambda t: f"[{t}]".encode()),  # mostly the fast path
        st.text(alphabet="0123456789,- .e\"[]", max_size=30).map(lambda t: f"[{t}]".encode()),
        st.binary(max_size=30),
    )
)
def test_nothing_is_accepted_that_would_not_read_back_as_ids(raw: bytes) -> None:
    """Without the server's count (an answer without usage): with one, the count is checked, not each element
    (polar_cli.proxy.token_json.json_ids_ok)."""
    ids = JsonTokenIds(raw)
    if json_ids_ok(ids):
        values: Any = orjson.loads(raw)
        assert isinstance(values, list) and all(type(v) is int and v >= 0 for v in values)
        assert len(values) == len(ids)



@given(
    st.one_of(
        st.text(alphabet="0123456789,", max_size=40).map(str.encode),
        st.binary(max_size=40),  # every byte value: one below "0" wraps around in the scan and must not pass as a digit
    )
)
def test_the_scan_with_the_servers_count_reads_as_a_byte_by_byte_reading(inner: bytes) -> None:
    """With the server's count the text is accepted by its bytes alone: digits and single commas between the brackets,
    as many ids as the count (documented trust: ``[1,,2]`` with a count of 3 passes); anything else must parse."""
    raw = b"[" + inner + b"]"
    count = inner.count(b",") + 1 if inner else 0
    plain = all(c in b"0123456789," for c in inner) and not inner.startswith(b",") and not inner.endswith(b",")
    ok = json_ids_ok(JsonTokenIds(raw, count))
    if plain:
        assert ok
    else:
        try:
            values: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            values = None
        parsed = isinstance(values, list) and all(type(v) is int and v >= 0 for v in values) and len(values) == count
        assert ok is parsed


@pytest.mark.parametrize(("raw", "count"), [(b"[]", 0), (b"[ ]", 0), (b"[7]", 1), (b"[1,2,3]", 3), (b"[1, 2, 3]", 3)])
def test_a_streams_count_before_its_first_byte_reads_the_commas(raw: bytes, count: int) -> None:
    ids = JsonTokenIds(raw)
    assert json_ids_count(ids) == count and ids.checked is None  # the verdict waits for the stream's end
    assert json_ids_ok(ids) and len(ids) == count
