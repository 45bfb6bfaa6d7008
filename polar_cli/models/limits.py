"""Upper bounds on what a request to the rollout server may ask for (docs/service.md, "Limits").

Every count, list, timeout and identifier a request body carries is bounded here, as a typed pydantic field, so
one request can never make the server do unbounded work: ``num_samples`` 2**63 is a 400 naming the field, not a
server growing until the kernel kills it. Bounds apply after pydantic's coercion, so ``"18446744073709551616"`` (a
number sent as a string) is refused exactly as the number is.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, StringConstraints

MAX_NUM_SAMPLES = 4096
"""Sessions one task may expand into (``num_samples``): a larger group is several tasks."""
MAX_COUNT = 2**31 - 1
"""Any other count a request carries (sampling's ``max_tokens`` and ``top_k``, session limits, attempts, a node's
load): what every inference server and database here holds as a 32-bit signed integer."""
MAX_RUN_SLOTS = 65_536
"""Run slots (and init/postrun workers) a gateway node may register with."""
MAX_LISTED_SESSIONS = 262_144
"""Session ids one node message may list (a heartbeat's ``sessions``, a registration's ``held_results``)."""
MAX_REPLICAS = 1024
"""Replica URLs one message may list (``load_weights``' ``urls``)."""
MAX_ID_LENGTH = 256
"""Characters of a task id or node id (a session id is at most 128: ``polar_cli.ids``)."""
MAX_URL_LENGTH = 2048
"""Characters of a URL a request gives (a node's URL, a callback URL, a replica's URL)."""
MAX_TOKEN_LENGTH = 512
"""Characters of a node's token."""
MAX_PATH_LENGTH = 4096
"""Characters of a path a request gives (``load_weights``' checkpoint path)."""
MAX_TIMEOUT_S = 604_800.0
"""The longest timeout a task may set (its session's, its agent's, its evaluator's, a prepare step's): a week."""
MAX_WAIT_S = 3600.0
"""The longest a long poll (``GET /rollout/task/{id}?wait=``) may be held: an hour."""

MIB = 1 << 20
MAX_CONTROL_BODY_BYTES = 1 * MIB
"""A body of the inference routes (``/inference/...``, on the server and on a gateway): a few fields."""
MAX_NODE_BODY_BYTES = 64 * MIB
"""A node's registration or heartbeat: up to ``MAX_LISTED_SESSIONS`` ids of 128 characters fit in 34 MiB."""
MAX_TASK_BODY_BYTES = 64 * MIB
"""A task (``POST /rollout/task/submit``; a gateway's ``POST /sessions``, ``/sessions/batch``, also within its
``max_body_mb``): its instruction, metadata and specs."""
MAX_RESULT_BODY_BYTES = 256 * MIB
"""A session's result (``POST /callbacks/session_result``): its trajectory, every trace's token ids and logprobs."""

_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")


def _http_url(value: str) -> str:
    """``value`` if it is an http(s) URL with a host, in visible ASCII (what every HTTP client can send to)."""
    if _VISIBLE_ASCII.fullmatch(value) is None:
        raise ValueError("a URL is visible ASCII characters (no spaces; percent-encode anything else)")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not 0..65535
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise ValueError("the URL's scheme must be http or https")
    if not parts.hostname:
        raise ValueError("the URL has no host")
    return value


HttpURL = Annotated[str, StringConstraints(min_length=1, max_length=MAX_URL_LENGTH), AfterValidator(_http_url)]
"""An http(s) URL with a host, visible ASCII, at most ``MAX_URL_LENGTH`` characters."""



def _visible_ascii(value: str) -> str:
    if _VISIBLE_ASCII.fullmatch(value) is None:
        raise ValueError("a token is visible ASCII characters (no spaces): it travels in an Authorization header")
    return value


NodeToken = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TOKEN_LENGTH), AfterValidator(_visible_ascii)]
"""A node's token: visible ASCII (it travels in an ``Authorization`` header), at most ``MAX_TOKEN_LENGTH``."""

BoundedId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_LENGTH)]
"""A task id or node id: 1 to ``MAX_ID_LENGTH`` characters."""

Timeout = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)]
"""A timeout in seconds: more than 0, at most ``MAX_TIMEOUT_S``."""

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
"""A count: 0 to ``MAX_COUNT``."""
