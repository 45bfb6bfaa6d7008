"""The gateway proxy: provider codecs, synthetic streaming, token capture, inference backends.

This module is the proxy's public surface: code outside ``polar_cli/proxy`` imports only from ``polar_cli.proxy``
(``tests/test_layering_proxy.py`` checks it); its submodules are internal.

- Serving: :class:`ProxyConfig`, :class:`ProxyState` (one proxy's backend client, sessions and URLs),
  :func:`create_proxy_app` (the aiohttp app, also mounted by the gateway with :func:`proxy_error_shape`),
  :func:`serve_proxy` (``polar proxy``).
- Sessions and records: :func:`session_options` and :func:`inline_script` (what a session or task may pass its
  backend), :func:`read_journal` (a session's journaled Completions), :func:`detect` (which provider route a request
  is); :func:`mask_session`, :func:`messages_divergence` and :func:`tools_digest` (a replayed request against the
  original's, as the scripted backend checks a turn's ``expect``).
- The inference pool: :class:`InferencePool` (the proxy's backend: replicas, routing, pause and resume, policy
  versions, weight loads) with :class:`PoolConfig`, and :class:`RetryConfig` (how hard an upstream call is tried).
- Backends: the built-in clients (:class:`VllmClient`, :class:`SglangClient`, :class:`OpenAICompatClient` with
  :class:`HttpBackendConfig`; :class:`ScriptedClient` with :class:`ScriptedConfig`), :class:`HttpChatClient` (their
  base) and :func:`demo_tokenizer_dir`; the wire types :class:`ChatRequest` and :class:`Generation` live in
  :mod:`polar_cli.models.chat` and are re-exported here.
"""

from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy.app import create_proxy_app, proxy_error_shape
from polar_cli.proxy.backends.http import HttpBackendConfig, HttpChatClient
from polar_cli.proxy.backends.openai import OpenAICompatClient
from polar_cli.proxy.backends.script_check import mask_session, messages_divergence, tools_digest
from polar_cli.proxy.backends.scripted import ScriptedClient, ScriptedConfig
from polar_cli.proxy.backends.sglang import SglangClient
from polar_cli.proxy.backends.vllm import VllmClient
from polar_cli.proxy.codecs import detect
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.journal import journal_path, read_journal
from polar_cli.proxy.limits import SessionGuard
from polar_cli.proxy.pool import InferencePool, PoolConfig
from polar_cli.proxy.render import demo_tokenizer_dir, load_tokenizer
from polar_cli.proxy.retry import RetryConfig
from polar_cli.proxy.sampling import reshaping
from polar_cli.proxy.server import serve_proxy
from polar_cli.proxy.sessions import inline_script, session_options
from polar_cli.proxy.state import ProxyState

__all__ = [
    "ChatRequest",
    "Generation",
    "HttpBackendConfig",
    "HttpChatClient",
    "InferencePool",
    "OpenAICompatClient",
    "PoolConfig",
    "ProxyConfig",
    "ProxyState",
    "RetryConfig",
    "ScriptedClient",
    "ScriptedConfig",
    "SessionGuard",
    "SglangClient",
    "VllmClient",
    "create_proxy_app",
    "demo_tokenizer_dir",
    "detect",
    "inline_script",
    "journal_path",
    "load_tokenizer",
    "mask_session",
    "messages_divergence",
    "proxy_error_shape",
    "read_journal",
    "reshaping",
    "serve_proxy",
    "session_options",
    "tools_digest",
]
