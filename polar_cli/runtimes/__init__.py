"""Built-in runtimes (``local``, ``docker``, ``apptainer``) and the helpers they share.

The interface is :mod:`polar_cli.interfaces.runtime`; :func:`start_session` is the one-call entry for the gateway.
Internal: a runtime plugin takes what it needs from :mod:`polar_cli.api`.
"""

from polar_cli.runtimes.prepare import run_prepare, start_session

__all__ = ["run_prepare", "start_session"]
