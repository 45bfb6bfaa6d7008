"""Small helpers shared by provider codecs: ids, thinking signatures, tools, images, stream chunking.

Signatures are how a provider lets a client hand the model's hidden reasoning back. This proxy's are deterministic
(the same text always gets the same signature), so a round trip through a harness never changes a request:

- :func:`sign_thinking` — ``"polar-" + sha256(text)``: for protocols whose blocks carry the text next to the
  signature (Anthropic ``thinking``). :func:`own_signature` tells this proxy's signatures from foreign ones.
- :func:`seal_thought` / :func:`unseal_thought` — the text itself inside a base64 signature: for protocols whose
  clients keep the signature but drop the text (Google ``thoughtSignature``), so the reasoning can be restored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

import orjson

from polar_cli.errors import ProtocolError

SIGNATURE_PREFIX = "polar-"
_SEAL_MAGIC = b"polar-ts1:"
_DIGEST_CHARS = 32  # hex chars of sha256 kept inside a sealed thought (128 bits: a checksum, not security)
STREAM_CHUNK_CHARS = 256  # synthetic streams split long texts into deltas of at most this many characters


def new_id(prefix: str) -> str:
    """A fresh random id such as ``msg_<24 hex>``."""
    return prefix + uuid.uuid4().hex[:24]


def stable_id(prefix: str, *parts: object) -> str:
    """A deterministic id derived from ``parts`` (same inputs, same id)."""
    seed = "\x1f".join(str(p) for p in parts).encode()
    return prefix + hashlib.sha256(seed).hexdigest()[:24]


def sign_thinking(text: str) -> str:
    """This proxy's deterministic signature of a thinking text."""
    return SIGNATURE_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def own_signature(signature: Any, text: str) -> bool:
    """True when ``signature`` is this proxy's signature of exactly ``text``."""
    return isinstance(signature, str) and signature == sign_thinking(text)


def seal_thought(text: str) -> str:
    """A base64 signature that carries ``text`` (checksummed), so the reasoning survives clients that drop it."""
    raw = text.encode()
    digest = hashlib.sha256(raw).hexdigest()[:_DIGEST_CHARS].encode()
    return base64.b64encode(_SEAL_MAGIC + digest + raw).decode()


def unseal_thought(value: Any) -> str | None:
    """The text inside a :func:`seal_thought` signature (standard or URL-safe base64); None if foreign/tampered."""
    if not isinstance(value, str) or not value:
        return None
    try:
        cleaned = value.replace("-", "+").replace("_", "/")
        raw = base64.b64decode(cleaned + "=" * (-len(cleaned) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw.startswith(_SEAL_MAGIC):
        return None
    digest, payload = raw[len(_SEAL_MAGIC) : len(_SEAL_MAGIC) + _DIGEST_CHARS], raw[len(_SEAL_MAGIC) + _DIGEST_CHARS :]
    if hashlib.sha256(payload).hexdigest()[:_DIGEST_CHARS].encode() != digest:
        return None
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return None


def function_tool(name: str, description: Any, parameters: dict[str, Any]) -> dict[str, Any]:
    """One normalized (OpenAI chat) function tool."""
    function: dict[str, Any] = {"name": name}
    if isinstance(description, str):
        function["description"] = description
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def each_object(items: list[Any], where: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """``(position, path, item)`` for each item of a request list at ``where`` (path ``where[position]``, for error
    messages); a 400 naming the path when an item is not an object."""
    for k, item in enumerate(items):
        at = f"{where}[{k}]"
        if not isinstance(item, dict):
            raise ProtocolError(f"{at} must be an object")
        yield k, at, item


def tool_objects(raw: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(position, tool)`` for each object of a request's ``tools`` list (nothing when absent); a 400 otherwise."""
    if raw is None:
        return
    if not isinstance(raw, list):
        raise ProtocolError("'tools' must be a list")
    for k, _, tool in each_object(raw, "tools"):
        yield k, tool


def dump_arguments(value: Any) -> str:
    """Tool-call arguments as the compact JSON string chat backends expect (strings pass through unchanged)."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value if value is not None else {}).decode()


def load_arguments(arguments: Any) -> dict[str, Any]:
    """Tool-call arguments as an object for protocols that need one (Anthropic ``input``, Google ``args``).

    Models sometimes write invalid JSON or a non-object; the text is then kept whole under ``"arguments"`` rather
    than lost, so the client sees what the model produced.
    """
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str | bytes) else arguments
    except orjson.JSONDecodeError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def data_url_part(mime_type: str, data: str) -> dict[str, Any]:
    """An OpenAI chat ``image_url`` part holding base64 ``data`` as a data URL."""
    return {"type": "image_url", "image_url": {"url": f"data:{mime_type};base64,{data}"}}


def url_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def user_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Chat user content: one string when every part is text (joined by newlines, as vLLM joins them), else parts."""
    if all(p.get("type") == "text" for p in parts):
        return "\n".join(str(p.get("text", "")) for p in parts)
    return parts


def chunks(text: str, size: int = STREAM_CHUNK_CHARS) -> Iterator[str]:
    """``text`` in pieces of at most ``size`` characters (nothing for an empty text)."""
    for start in range(0, len(text), size):
        yield text[start : start + size]
