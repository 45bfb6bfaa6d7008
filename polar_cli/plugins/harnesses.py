"""Built-in harnesses: ``shell``, ``pi``, ``qwen_code``, ``gemini_cli``, ``opencode``, ``kilocode``, ``cline``,
``continue_cli``, ``openclaw``, ``grok_cli``, ``nanocoder``, ``gptme``, ``hermes``.

``codex`` and ``claude_code`` are separate plugin packages (plugins/polar-codex, plugins/polar-claude-code).
"""

from __future__ import annotations

from polar_cli.harnesses.cline import ClineHarness
from polar_cli.harnesses.continue_cli import ContinueCliHarness
from polar_cli.harnesses.gemini_cli import GeminiCliHarness
from polar_cli.harnesses.gptme import GptmeHarness
from polar_cli.harnesses.grok_cli import GrokCliHarness
from polar_cli.harnesses.hermes import HermesHarness
from polar_cli.harnesses.kilocode import KilocodeHarness
from polar_cli.harnesses.nanocoder import NanocoderHarness
from polar_cli.harnesses.openclaw import OpenclawHarness
from polar_cli.harnesses.opencode import OpencodeHarness
from polar_cli.harnesses.pi import PiHarness
from polar_cli.harnesses.qwen_code import QwenCodeHarness
from polar_cli.harnesses.shell import ShellHarness
from polar_cli.hookspecs import RegisterHarness, hookimpl


@hookimpl
def register_harnesses(register: RegisterHarness) -> None:
    register(ShellHarness())
    register(PiHarness())
    register(QwenCodeHarness())
    register(GeminiCliHarness())
    register(OpencodeHarness())
    register(KilocodeHarness())
    register(ClineHarness())
    register(ContinueCliHarness())
    register(OpenclawHarness())
    register(GrokCliHarness())
    register(NanocoderHarness())
    register(GptmeHarness())
    register(HermesHarness())
