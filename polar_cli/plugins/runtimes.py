"""Built-in runtimes: ``local`` (the default), ``docker`` and ``apptainer``.

Their modules import their optional dependencies (``docker``, ``spython``) only when a session starts.
"""

from __future__ import annotations

from polar_cli.hookspecs import RegisterRuntime, hookimpl
from polar_cli.runtimes.apptainer import ApptainerRuntime
from polar_cli.runtimes.docker import DockerRuntime
from polar_cli.runtimes.local import LocalRuntime


@hookimpl
def register_runtimes(register: RegisterRuntime) -> None:
    register(LocalRuntime())
    register(DockerRuntime())
    register(ApptainerRuntime())
