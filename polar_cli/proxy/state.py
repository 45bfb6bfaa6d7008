"""ProxyState: the inference pool (the backend client), the session registry and the URLs, shared by the HTTP app
and the gateway."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from polar_cli.errors import BackendError
from polar_cli.interfaces.backend import BackendClient
from polar_cli.metrics import PoolReading, ProxyMetrics, ReplicaReading, replica_label
from polar_cli.models import Completion, TokenMode
from polar_cli.models.inference import is_remote
from polar_cli.models.task import SamplingSpec, SessionLimits
from polar_cli.proxy.budget import DEFAULT_PROMPT_TOKENS, PromptBudget
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.pool import InferencePool
from polar_cli.proxy.sessions import Session, SessionRegistry, base_urls

log = logging.getLogger("polar.proxy")


class ProxyState:
    """One proxy's live state. The gateway uses it directly from Python; the aiohttp app serves it over HTTP."""

    def __init__(
        self, config: ProxyConfig, backend: BackendClient | None = None, *, metrics: ProxyMetrics | None = None
    ) -> None:
        from polar_cli.registry import get_backend

        self.config = config
        self.metrics = metrics or ProxyMetrics()
        """Its calls, captures and journal, and its pool's upstream calls (``self.metrics.registry``: a gateway node
        exports it with its pipeline's metrics)."""
        if backend is None:
            factory = get_backend(config.backend)

            def make_client(url: str | None) -> BackendClient:
                return factory.client(**config.backend_config(url, pooled=True))

            # creating the clients validates the backend options and loads tokenizers/scripts: fail fast, before
            # serving
            self.pool = InferencePool(make_client, config.backend_urls(), retry=config.retry,
                                      timeout_s=config.backend_timeout_s or 600.0, config=config.pool)  # fmt: skip
        else:
            self.pool = backend if isinstance(backend, InferencePool) else InferencePool.of(backend)
        self.pool.metrics = self.metrics
        self.backend: BackendClient = self.pool
        self.registry = SessionRegistry(self.pool, config.journal_dir, config.token_mode)
        self.metrics.watch(self._pool_reading, lambda: len(self.registry.sessions()))
        self.base_url: str | None = config.public_url
        self._models: list[str] | None = None
        self._budget: PromptBudget | None = None
        self._budget_warned = False

    def _pool_reading(self) -> PoolReading:
        status = self.pool.status()
        replicas = [ReplicaReading(replica_label(r.url if is_remote(r.url) else None), r.state == "healthy",
                                   r.in_flight) for r in status.replicas]  # fmt: skip
        return PoolReading(status.policy_version, status.paused is not None, status.waiting, replicas)

    def session_info(self, session: Session, base_url: str | None = None) -> dict[str, Any]:
        """What a session's creator needs: id, secret, base URLs per provider family."""
        info = session.summary(base_url or self.base_url)
        info["api_key"] = session.api_key
        return info

    async def create_session(
        self,
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        backend_options: Mapping[str, Any] | None = None,
        *,
        fresh: bool = False,
        sampling: SamplingSpec | None = None,
        limits: SessionLimits | None = None,
        token_mode: TokenMode | None = None,
        keep_reasoning: bool = True,
    ) -> dict[str, Any]:
        session = await self.registry.create_session(
            session_id, metadata, backend_options, fresh=fresh, sampling=sampling, limits=limits,
            token_mode=token_mode, keep_reasoning=keep_reasoning,
        )  # fmt: skip
        return self.session_info(session)

    def get_completions(self, session_id: str) -> list[Completion]:
        return self.registry.get_completions(session_id)

    async def close_session(self, session_id: str) -> Session:
        return await self.registry.close_session(session_id)

    def urls(self, session_id: str) -> dict[str, str]:
        return base_urls(self.base_url or "", session_id)

    async def models(self) -> list[str]:
        """The backend's model names, asked once."""
        if self._models is None:
            self._models = await self.backend.models() or ["default"]
        return self._models

    async def prompt_budget(self) -> PromptBudget:
        """The prompt budget of every request (:mod:`polar_cli.proxy.budget`): ``max_prompt_tokens``, else the model's
        context length (asked once; asked again next time when the backend could not be asked), else the default."""
        if self._budget is not None:
            return self._budget
        if self.config.max_prompt_tokens is not None:
            self._budget = PromptBudget(self.config.max_prompt_tokens, "config")
            return self._budget
        try:
            context = await self.backend.context_tokens()
        except BackendError as exc:
            if not self._budget_warned:
                self._budget_warned = True
                log.warning("the backend's context length is unknown for now (%s): prompts get the default budget "
                            "until it answers", exc)  # fmt: skip
            return PromptBudget(DEFAULT_PROMPT_TOKENS)
        self._budget = PromptBudget(context, "model") if context else PromptBudget(DEFAULT_PROMPT_TOKENS)
        return self._budget

    async def close(self) -> None:
        await self.registry.close_all()
        await self.backend.close()
