"""Built-in harnesses: ``shell``, ``pi``, ``qwen_code``, ``gemini_cli``, ``opencode``, ``gptme``.

``codex`` and ``claude_code`` are separate plugin packages (plugins/polar-codex, plugins/polar-claude-code).
"""

from __future__ import annotations

from polar_cli.harnesses.gemini_cli import GeminiCliHarness
from polar_cli.harnesses.gptme import GptmeHarness
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
    register(GptmeHarness())
