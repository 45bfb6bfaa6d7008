"""Where this gateway runs, read from the environment its scheduler gives it: under Slurm (``SLURM_JOB_ID`` set) the
job, the step (``srun`` sets ``SLURM_STEP_ID``; a batch script's own step has none) and the node
(``SLURMD_NODENAME``); under Ray (``polar_cli.ray`` sets ``POLAR_RAY_NODE_ID`` and ``POLAR_RAY_NODE_IP`` for the
gateways it starts) the node's id and IP; elsewhere the host name alone. The gateway sends it when it registers."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from polar_cli.models import Placement

RAY_NODE_ID_ENV = "POLAR_RAY_NODE_ID"
RAY_NODE_IP_ENV = "POLAR_RAY_NODE_IP"


def from_environment(env: Mapping[str, str] | None = None) -> Placement:
    env = os.environ if env is None else env
    ray_node = env.get(RAY_NODE_ID_ENV)
    if ray_node:
        return Placement(host=env.get(RAY_NODE_IP_ENV) or socket.gethostname(), scheduler="ray", node=ray_node)
    host = env.get("SLURMD_NODENAME") or socket.gethostname()
    job = env.get("SLURM_JOB_ID")
    if not job:
        return Placement(host=host)
    return Placement(host=host, scheduler="slurm", job_id=job, step_id=env.get("SLURM_STEP_ID") or None)
