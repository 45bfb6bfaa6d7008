"""Harness adapters: the shared npm base, installs into Polar-managed prefixes, running a harness, ``polar doctor``.

Built-ins (``shell``, ``pi``, ``qwen_code``, ``gemini_cli``, ``opencode``, ``kilocode``, ``cline``, ``continue_cli``)
are registered by :mod:`polar_cli.plugins.harnesses`; ``codex`` and ``claude_code`` live in the polar-codex and
polar-claude-code plugins.
Internal: a plugin takes ``NpmHarness`` and its helpers from :mod:`polar_cli.api`.
"""
