"""The rollout server: task API, scheduler, node registry, persistence (``polar serve``; docs/service.md)."""
