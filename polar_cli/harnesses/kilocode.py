"""Kilo Code CLI (``@kilocode/cli``, binary ``kilo``): an opencode fork, driven like :mod:`opencode`.

The same config shape (one provider ``polar`` through the bundled ``@ai-sdk/openai-compatible``, ``model`` and
``small_model`` the served model, the title agent off, every permission allowed, autoupdate and sharing off) goes to
``.config/kilo/kilo.json`` under the session home (``XDG_*``); the off switches are read with a ``KILO_`` prefix, plus
``KILO_DISABLE_SESSION_INGEST`` and ``KILO_DISABLE_PRESENCE`` (its cloud session sync and presence pings),
``KILO_TELEMETRY_LEVEL=off`` and ``KILO_NO_DAEMON``. ``kilo run`` takes the instruction on stdin, ``--format json``
prints its events. The npm package's postinstall copies the native binary of ``@kilocode/cli-linux-x64`` (an optional
dependency) into place, so its script is allowed. Config: ``settings`` (merged into kilo.json), ``model_limits``.
"""

from __future__ import annotations

from typing import ClassVar

from polar_cli.harnesses.opencode import OpencodeHarness


class KilocodeHarness(OpencodeHarness):
    name: ClassVar[str] = "kilocode"
    description: ClassVar[str] = "Kilo Code CLI (@kilocode/cli), an opencode fork, OpenAI chat"
    npm_package: ClassVar[str] = "@kilocode/cli"
    version: ClassVar[str] = "7.7.7"
    binary: ClassVar[str] = "kilo"
    allow_scripts: ClassVar[tuple[str, ...]] = ("@kilocode/cli",)
    config_file: ClassVar[str] = ".config/kilo/kilo.json"
    config_schema: ClassVar[str] = "https://app.kilo.ai/config.json"
    env_prefix: ClassVar[str] = "KILO_"
    extra_env: ClassVar[dict[str, str]] = {
        "KILO_DISABLE_SESSION_INGEST": "1",
        "KILO_DISABLE_PRESENCE": "1",
        "KILO_TELEMETRY_LEVEL": "off",
        "KILO_NO_DAEMON": "1",
    }
