"""Token ids as the JSON text a server sent, never parsed on the proxy's hot path.

vLLM sends a 32K-token prompt's ids as ~200 KB of JSON text, in its answer or in a stream's first chunk; parsing them
into ints costs about a millisecond per call. The proxy only needs their count, a check that they are plain
non-negative ints, and the text itself, which goes verbatim into the journal (``orjson.Fragment``):

- :func:`split_prompt_ids` cuts the top-level ``prompt_token_ids`` array out of a body without parsing it;
- :func:`loads_keeping_prompt_ids` parses the rest and puts the ids back as a :class:`JsonTokenIds`;
- :func:`json_ids_count` and :func:`json_ids_ok` count and check the text as bytes (numpy comparisons, the verdict
  remembered on the object) against the server's own count: a stream counts its prompt's commas before its first
  byte (~15 us for 32K ids) and checks the whole text at the end (~45 us), once the usage chunk has said how many ids
  it sent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from polar_cli.models.chat import JsonTokenIds

KEY = b'"prompt_token_ids":'
_SPACE = b" \t\r\n"
_COMMA = np.uint8(ord(","))
_ZERO = np.uint8(ord("0"))
_NINE = np.uint8(ord("9"))


def split_prompt_ids(raw: bytes) -> tuple[bytes, JsonTokenIds] | None:
    """Cut the first ``prompt_token_ids`` array out of a JSON body without parsing its ints.

    A JSON string cannot contain an unescaped ``"`` so ``"prompt_token_ids":`` only matches a key; vLLM has it once.
    Returns the body with ``[]`` in its place and the ids as JSON text, or None to fall back to a full parse.
    """
    key = raw.find(KEY)
    if key < 0:
        return None
    start = key + len(KEY)
    while start < len(raw) and raw[start] in _SPACE:
        start += 1
    if raw[start : start + 1] != b"[":
        return None
    end = raw.find(b"]", start)
    if end < 0:
        return None
    array = raw[start : end + 1]
    if b"\n" in array or b"\r" in array:
        return None  # would break a JSONL line when written verbatim
    return raw[:start] + b"[]" + raw[end + 1 :], JsonTokenIds(array)


def loads_keeping_prompt_ids(raw: bytes) -> Any:
    """``raw`` as JSON; an object's top-level ``prompt_token_ids`` array comes back as a :class:`JsonTokenIds`
    (unparsed). Where the key is not exactly once at the top level (nested, repeated), everything is parsed."""
    split = split_prompt_ids(raw)
    if split is None:
        return orjson.loads(raw)
    rest, ids = split
    data = orjson.loads(rest)
    if not isinstance(data, dict) or data.get("prompt_token_ids") != [] or rest.count(KEY) != 1:
        return orjson.loads(raw)  # the cut array was not the top-level one
    data["prompt_token_ids"] = ids
    return data


def json_ids_count(ids: JsonTokenIds) -> int:
    """How many ids the text holds: the known ``length``, else its commas + 1 (one comparison over the bytes, ~15 us
    for 32K ids); no verdict yet (a stream counts its prompt before its first byte and checks it at the end, once the
    server has said how many ids it sent: a text the check refuses ends the stream in an error event, so a count read
    off an odd text is never journaled)."""
    if ids.length >= 0:
        return ids.length
    if ids.commas is not None and ids.commas >= 0:
        return ids.commas + 1 if ids.raw != b"[]" else 0
    raw = ids.raw
    commas = int(np.count_nonzero(np.frombuffer(raw, dtype=np.uint8) == _COMMA))
    return commas + 1 if commas or raw.strip(b"[] \t\r\n") else 0


def json_ids_ok(ids: JsonTokenIds) -> bool:
    """The text is a JSON array of non-negative ints. The verdict is kept on ``ids`` (checked once), and a count
    that was unknown (``length`` -1) is set from the text.

    With the server's count (vLLM's ``usage.prompt_tokens``, in every answer and at the end of every stream the proxy
    asks for): one scan in which every byte between the brackets is a digit or a comma, with one comma fewer than
    that count; the digits between are trusted to be that many ids (a server that sent ``[1,,2]`` with a count of 3
    is not caught here: a reader skips that line, with a warning). Without a count, or for any other text
    (whitespace), the ids are parsed."""
    if ids.checked is None:
        ids.checked = _check(ids)
    return ids.checked


def _commas(ids: JsonTokenIds) -> int:
    """The commas of a plain ``[1,2,3]`` text (digits and commas, no comma first or last), -1 for anything else."""
    if ids.commas is None:
        ids.commas = _plain_commas(ids.raw)
    return ids.commas


def _plain_commas(raw: bytes) -> int:
    if raw == b"[]":
        return 0
    if len(raw) < 3 or raw[:1] != b"[" or raw[-1:] != b"]" or raw[1:2] == b"," or raw[-2:-1] == b",":
        return -1
    # three vectorized comparisons over the bytes between the brackets (~0.2 ns a byte; bytes.translate took ~0.6):
    # every byte that is not a digit must be a comma
    inner = np.frombuffer(raw, dtype=np.uint8, count=len(raw) - 2, offset=1)
    commas = int(np.count_nonzero(inner == _COMMA))
    others = int(np.count_nonzero(inner < _ZERO)) + int(np.count_nonzero(inner > _NINE))
    return commas if others == commas else -1


def _check(ids: JsonTokenIds) -> bool:
    if ids.raw == b"[]":
        if ids.length < 0:
            ids.length = 0
        return ids.length == 0
    if ids.length >= 0:
        commas = _commas(ids)
        if commas >= 0:
            return commas == ids.length - 1
    try:  # no count to hold the text to: only a parse tells empty elements, leading zeros and huge numbers apart
        values = orjson.loads(ids.raw)
    except orjson.JSONDecodeError:
        return False
    if not (isinstance(values, list) and all(type(i) is int and i >= 0 for i in values)):
        return False
    if ids.length < 0:
        ids.length = len(values)
    return len(values) == ids.length  # with the server's count, the parsed text holds that many too
