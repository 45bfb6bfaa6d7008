"""Polar's one exception tree.

::

    PolarError                       anything Polar reports to a user (one line, non-zero exit)
    ├── ConfigError                  bad user input: a task file, a spec, a CLI option (names field and file)
    ├── PluginError                  a plugin failed to load, registered a bad or duplicate name
    │   └── UnknownComponentError    a name nobody registered (lists the available names)
    ├── ProxyError                   the gateway proxy could not serve a call
    │   ├── ProtocolError            a malformed provider request (becomes a provider-shaped 400)
    │   │   ├── BodyTooLargeError    a request body over the proxy's limit (413)
    │   │   ├── PromptTooLongError   a prompt over the proxy's token budget (400, before it is tokenized)
    │   │   └── UnsupportedEncodingError  a body in a Content-Encoding the server cannot decode (415)
    │   └── BackendError             the inference backend failed (after retries)
    │       └── BackendBusy          it accepted the connection but answered too slowly, or 503 (busy or loading)
    ├── RuntimeFailure               a runtime could not start, exec, copy or stop
    ├── HarnessError                 a harness could not be installed, configured or run
    ├── BuildError                   a trajectory could not be built from recorded completions
    │   └── VerificationError        a trajectory broke the token-faithfulness contract
    ├── EvaluationError              an evaluator failed
    ├── SessionError                 a session is unknown, cancelled or in the wrong state
    │   ├── SessionExistsError       a session (or task) id that is already taken
    │   ├── TaskNotEndedError        a call that needs an ended task (an acknowledgement) on one still running
    │   └── RemovedError             a task whose results retention removed (410)
    ├── AuthError                    a control call without the right token
    │   └── ForbiddenError           a valid token used for something it may not touch (a node, another's session)
    ├── ServiceUnavailableError      a Polar server cannot be reached (refused, timed out, broken connection)
    ├── PoolControlError             an inference-pool control call could not be done (a gateway failed, a version
    │                                going back)
    ├── HubError                     the HuggingFace Hub refused, failed or could not be reached
    ├── AdapterError                 results could not be turned into a trainer's samples (polar_cli.trainers)
    │   └── MissingLogprobError      a trainable token (loss_mask 1) without a logprob (names session and position)
    └── MissingDependencyError       an optional package is not installed (names the extra that brings it)

Each class also declares the CLI's exit code (``exit_code``, docs/cli.md): ``EXIT_FAILED`` (1) the work ran and
failed; ``EXIT_USAGE`` (2) the command cannot run as given (a bad option, file, name or config, a 4xx answer from a
Polar server, an output that exists); ``EXIT_UNREACHABLE`` (3) a server, backend or hub cannot be reached or refused
the credentials. ``polar_cli.cli.main`` is the one place that turns them into the process's exit status.

Dependency exceptions are mapped at the boundary with ``raise PolarError(...) from exc``. Each class declares the HTTP
status it maps to on a server (``http_status``; BackendError carries its own per instance), so servers never find a
status by matching message text: see ``polar_cli.web.errors.status_for``. Messages quote what a client sent through
:func:`brief`, never a plain repr: a 6 MB string or a value nested 1000 deep must not make the error itself fail.
"""

from __future__ import annotations

import reprlib
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
"""The work ran and failed: a session or task ended in error, verify or doctor found problems, a runtime, harness,
builder or evaluator failed."""
EXIT_USAGE = 2
"""The command cannot run as given: a bad option, file, config or name, an existing output without --overwrite, a
data dir in use, a missing optional package, a 4xx (but 401/403) answer from a Polar server. Click's own usage errors
exit 2 too."""
EXIT_UNREACHABLE = 3
"""A Polar server, an inference backend or the HuggingFace Hub cannot be reached, or refused the token (401/403)."""


class PolarError(Exception):
    """Base class of every error Polar reports to users."""

    exit_code = EXIT_FAILED
    http_status = 500


class ConfigError(PolarError):
    """Bad user-provided configuration."""

    exit_code = EXIT_USAGE
    http_status = 400


class PluginError(PolarError):
    """A plugin failed to load or registered something invalid."""

    exit_code = EXIT_USAGE


class UnknownComponentError(PluginError):
    """A component name that no plugin registered."""

    http_status = 400


class ProxyError(PolarError):
    """The gateway proxy could not serve a call."""


class ProtocolError(ProxyError):
    """A malformed provider request."""

    http_status = 400


class BodyTooLargeError(ProtocolError):
    """A request body over the configured size limit."""

    http_status = 413


class PromptTooLongError(ProtocolError):
    """A prompt over the proxy's token budget (``polar_cli.proxy.budget``): refused before (or while) the proxy pays
    for its tokenization."""


class UnsupportedEncodingError(ProtocolError):
    """A request body in a ``Content-Encoding`` the server cannot decode (never read as if it were identity)."""

    http_status = 415


class BackendError(ProxyError):
    """The inference backend failed."""

    exit_code = EXIT_UNREACHABLE

    def __init__(self, message: str, *, status: int = 502, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.http_status = status
        self.retryable = retryable


class BackendBusy(BackendError):
    """The backend accepted the connection but did not answer in time, or answered 503: alive, busy or loading.
    The start-up check waits for it (``polar_cli.gateway.backend_check``); one that refuses fails at once."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503, retryable=True)


class RuntimeFailure(PolarError):
    """A runtime operation failed."""


class HarnessError(PolarError):
    """A harness could not be installed, configured or run."""


class BuildError(PolarError):
    """A trajectory could not be built."""


class VerificationError(BuildError):
    """A trajectory violates the token-faithfulness contract."""


class EvaluationError(PolarError):
    """An evaluator failed."""


class SessionError(PolarError):
    """A session is unknown or in the wrong state."""

    exit_code = EXIT_USAGE

    http_status = 404


class SessionExistsError(SessionError):
    """A session or task id that is already taken (by a different request)."""

    http_status = 409


class TaskNotEndedError(SessionError):
    """A call that needs an ended task (a trainer's acknowledgement) made on one that is still running."""

    http_status = 409


class RemovedError(SessionError):
    """A task the server knew, whose results its retention settings removed after a trainer acknowledged them."""

    http_status = 410


class AuthError(PolarError):
    """A control call without the right token."""

    exit_code = EXIT_UNREACHABLE

    http_status = 401


class ForbiddenError(AuthError):
    """A control call whose token is valid but not for what it asks (a node reporting another node's session)."""

    http_status = 403


class ServiceUnavailableError(PolarError):
    """A Polar server cannot be reached: connection refused, timed out or broken (worth retrying later)."""

    exit_code = EXIT_UNREACHABLE

    http_status = 503


class PoolControlError(PolarError):
    """A control call on the inference pools could not be done as asked: a gateway failed, timed out or refused it
    (the message names each one and what it said), or a policy version would go backwards."""

    exit_code = EXIT_USAGE

    http_status = 409


class HubError(PolarError):
    """The HuggingFace Hub refused or failed an operation (no token, offline mode, an existing repo, an HTTP error)
    or could not be reached."""

    exit_code = EXIT_UNREACHABLE

    http_status = 502


class AdapterError(PolarError):
    """Polar's results could not be turned into a trainer's samples (``polar_cli.trainers``)."""


class MissingLogprobError(AdapterError):
    """A token with ``loss_mask`` 1 has no usable logprob: the trace breaks the token-faithfulness contract."""


class MissingDependencyError(PolarError):
    """An optional package a command needs is not installed; the message names the extra to install
    (see ``polar_cli.extras``)."""

    exit_code = EXIT_USAGE


def brief(value: Any, limit: int = 80) -> str:
    """A bounded repr for error messages: never huge, never deep (no RecursionError on deeply nested values)."""
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother, short.maxlong = 2, limit, limit, limit
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 4
    text = short.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class PauseTimeout(PolarError):
    """A pause (or a replica's drain) did not see the inference pool quiet in time; the message says what it waited
    for. The pool stays paused: resume it, or pause again with a longer timeout."""

    http_status = 409
