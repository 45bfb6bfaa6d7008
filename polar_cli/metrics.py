"""Prometheus metrics: every metric Polar exports, declared here (docs/metrics.md is the table of them).

Each served component has its own ``CollectorRegistry`` (never the global default one: tests run several servers in
one process): a gateway node's holds :class:`ProxyMetrics` (its proxy and inference pool) and :class:`GatewayMetrics`
(its pipeline); the rollout server's holds :class:`ServerMetrics`. Events are counted where they happen (the seams
call the typed helpers below); numbers that mirror state (queue depths, sessions by state, the policy version) are
read from that state at scrape time by custom collectors, so they never drift.

Label values are bounded: provider, stage, status, HTTP code, stream mode, replica (the replica's URL key: replicas are
few), node health. Never a session or task id.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The Prometheus text format, as ``generate_latest`` writes it."""

STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
"""Session stages last from milliseconds (a queue wait) to hours (a long agent run)."""
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""A model call: milliseconds (a cached short answer) to minutes (a long generation)."""
IN_PROCESS = "in-process"
"""The replica label of a backend without a URL (the scripted one)."""


def new_registry() -> CollectorRegistry:
    """A registry of one served component (no default process collectors: several components share a process)."""
    return CollectorRegistry(auto_describe=True)


class _Reader(Collector):
    """A custom collector: ``read()`` yields metric families built from live state at scrape time."""

    def __init__(self, read: Callable[[], Iterable[Metric]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        return list(self._read())

    def describe(self) -> Iterable[Metric]:
        return []  # names are only known at collect time; the registry does not check them for clashes


Samples = Iterable[tuple[Iterable[str], float]]
"""(label values, value) pairs of one metric family."""


def _gauge(name: str, doc: str, labels: Iterable[str] = (), samples: Samples = ()) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def _counter(name: str, doc: str, labels: Iterable[str] = (), samples: Samples = ()) -> Metric:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def replica_label(url: str | None) -> str:
    """A replica's label value: its URL key (``replica_key``), or ``in-process`` for a backend without a URL."""
    return url or IN_PROCESS


# ---- the proxy and its inference pool (a gateway node, ``polar proxy``) ------------------------------------------


@dataclass
class ReplicaReading:
    """One replica as the pool sees it now."""

    replica: str
    healthy: bool
    in_flight: int


@dataclass
class PoolReading:
    """The inference pool now: what the collector exports at scrape time."""

    policy_version: int
    paused: bool
    waiting: int
    replicas: list[ReplicaReading] = field(default_factory=list)


class ProxyMetrics:
    """Model calls through the proxy, what they captured, the journal, and the inference pool's upstream calls."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or new_registry()
        r = self.registry
        self.requests = Counter(
            "polar_proxy_requests", "Requests to the proxy's per-session surface, by answer",
            ["provider", "endpoint", "code", "stream"], registry=r,
        )  # fmt: skip
        self.request_seconds = Histogram(
            "polar_proxy_request_duration_seconds", "Generation requests, from arrival to the end of the answer",
            ["provider", "stream"], buckets=CALL_BUCKETS, registry=r,
        )  # fmt: skip
        self.completions = Counter(
            "polar_proxy_completions", "Completions captured (journaled), by delivery", ["provider", "delivery"],
            registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "polar_proxy_prompt_tokens", "Prompt tokens of captured completions", ["provider"], registry=r
        )
        self.sampled_tokens = Counter(
            "polar_proxy_sampled_tokens", "Sampled (response) tokens of captured completions", ["provider"], registry=r
        )
        self.journal_bytes = Counter("polar_proxy_journal_bytes", "Bytes appended to session journals", registry=r)
        self.upstream_requests = Counter(
            "polar_inference_upstream_requests", "Attempts sent to an inference replica, by answer (code 200: it "
            "answered; a stream counts once it opened)", ["replica", "code"], registry=r,
        )  # fmt: skip
        self.upstream_seconds = Histogram(
            "polar_inference_upstream_duration_seconds", "One upstream attempt: to the whole answer, or to the "
            "stream's opening for streamed calls", ["replica", "stream"], buckets=CALL_BUCKETS, registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "polar_inference_retries", "Upstream attempts that were retries of a call (on this replica)", ["replica"],
            registry=r,
        )  # fmt: skip
        self.group_placements = Counter(
            "polar_inference_group_placements", "New sessions of a group placed by group affinity: on the group's "
            "first replica, or spilled over to a later one (the first was busier than the margin)", ["placed"],
            registry=r,
        )  # fmt: skip
        for placed in ("first", "spilled"):
            self.group_placements.labels(placed)
        self._pool: Callable[[], PoolReading] | None = None
        self._sessions: Callable[[], int] | None = None
        r.register(_Reader(self._collect))

    def watch(self, pool: Callable[[], PoolReading], sessions: Callable[[], int]) -> None:
        """Read the pool's state and the number of open proxy sessions at each scrape (the retry counter of each of
        its replicas starts at 0 now, so it is there before the first retry)."""
        self._pool, self._sessions = pool, sessions
        self.replicas_known(r.replica for r in pool().replicas)

    def replicas_known(self, replicas: Iterable[str]) -> None:
        """Start the per-replica counters of ``replicas`` (label values) at 0."""
        for replica in replicas:
            self.retries.labels(replica)

    def request(self, provider: str, endpoint: str, code: int, stream: bool, seconds: float | None) -> None:
        stream_value = "true" if stream else "false"
        self.requests.labels(provider, endpoint, str(code), stream_value).inc()
        if seconds is not None:
            self.request_seconds.labels(provider, stream_value).observe(seconds)

    def captured(self, provider: str, delivery: str, prompt_tokens: int, sampled_tokens: int, journal: int) -> None:
        """One completion journaled (``journal``: the bytes appended, 0 without a journal)."""
        self.completions.labels(provider, delivery).inc()
        self.prompt_tokens.labels(provider).inc(prompt_tokens)
        self.sampled_tokens.labels(provider).inc(sampled_tokens)
        if journal:
            self.journal_bytes.inc(journal)

    def upstream(self, replica: str, code: int, stream: bool, seconds: float, retry: bool) -> None:
        self.upstream_requests.labels(replica, str(code)).inc()
        self.upstream_seconds.labels(replica, "true" if stream else "false").observe(seconds)
        if retry:
            self.retries.labels(replica).inc()

    def group_placed(self, spilled: bool) -> None:
        self.group_placements.labels("spilled" if spilled else "first").inc()

    def _collect(self) -> Iterable[Metric]:
        if self._sessions is not None:
            yield _gauge("polar_proxy_sessions", "Proxy sessions open (routing calls)",
                         samples=[((), self._sessions())])  # fmt: skip
        if self._pool is None:
            return
        pool = self._pool()
        yield _gauge("polar_inference_policy_version", "The policy version new calls are sampled under",
                     samples=[((), pool.policy_version)])  # fmt: skip
        yield _gauge("polar_inference_paused", "1 while sampling is paused (new calls wait at the proxy)",
                     samples=[((), float(pool.paused))])  # fmt: skip
        yield _gauge("polar_inference_waiting_calls", "Model calls held at the proxy by a pause",
                     samples=[((), pool.waiting)])  # fmt: skip
        yield _gauge("polar_inference_replica_healthy", "1 when the replica is in rotation", ["replica"],
                     [((r.replica,), float(r.healthy)) for r in pool.replicas])  # fmt: skip
        yield _gauge("polar_inference_in_flight_calls", "Upstream calls in flight", ["replica"],
                     [((r.replica,), r.in_flight) for r in pool.replicas])  # fmt: skip


# ---- a gateway node's pipeline -------------------------------------------------------------------------------------

QUEUES = ("init", "ready", "postrun")
"""Stages with a queue in front (``ready``: the READY buffer, waiting for a run slot)."""
WORKERS = ("init", "running", "postrun")
CAPACITIES = ("init", "ready", "running", "postrun")


class GatewayMetrics:
    """The staged pipeline: sessions by stage and outcome (read from ``StagedPipeline.metrics()`` at scrape time) and
    the stage durations of each finished session (:meth:`session_finished`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry = registry or new_registry()
        self._pipeline: Callable[[], Mapping[str, Any]] | None = None
        self._sandboxes: Callable[[], Mapping[str, int]] | None = None
        self.stage_seconds = Histogram(
            "polar_gateway_stage_duration_seconds", "Seconds a finished session spent in each stage and wait "
            "(SessionResult.stage_seconds)", ["stage"], buckets=STAGE_BUCKETS, registry=registry,
        )  # fmt: skip
        registry.register(_Reader(self._collect))

    def watch(self, pipeline: Callable[[], Mapping[str, Any]]) -> None:
        """Read ``pipeline()`` (``StagedPipeline.metrics()``) at each scrape."""
        self._pipeline = pipeline

    def watch_sandboxes(self, pool: Callable[[], Mapping[str, int]]) -> None:
        """Read ``pool()`` (``SandboxPool.snapshot()``) at each scrape."""
        self._sandboxes = pool

    def session_finished(self, stage_seconds: Mapping[str, float]) -> None:
        for stage, seconds in stage_seconds.items():
            self.stage_seconds.labels(stage).observe(seconds)

    def _collect(self) -> Iterable[Metric]:
        if self._sandboxes is not None:
            pool = self._sandboxes()
            yield _counter("polar_gateway_sandbox_takes", "Sandboxes INIT took from the warm pool (hit) or had to "
                           "start (miss)", ["result"],
                           [(("hit",), pool["hits"]), (("miss",), pool["misses"])])  # fmt: skip
            yield _counter("polar_gateway_sandbox_resets", "Resets of used sandboxes (reuse: reset): ok, or failed "
                           "(the sandbox was destroyed)", ["result"],
                           [(("ok",), pool["resets_ok"]), (("failed",), pool["resets_failed"])])  # fmt: skip
            yield _counter("polar_gateway_sandbox_starts", "Sandboxes the pool started, by result", ["result"],
                           [(("ok",), pool["started"]), (("failed",), pool["start_failures"])])  # fmt: skip
            yield _counter("polar_gateway_sandboxes_destroyed", "Pooled sandboxes stopped",
                           samples=[((), pool["destroyed"])])  # fmt: skip
            yield _gauge("polar_gateway_sandbox_pool_ready", "Sandboxes ready in the pool",
                         samples=[((), pool["ready"])])  # fmt: skip
        if self._pipeline is None:
            return
        m = self._pipeline()
        stages, sessions = m["stages"], m["sessions"]
        yield _counter("polar_gateway_sessions_submitted", "Sessions submitted to this gateway",
                       samples=[((), sessions["submitted"])])  # fmt: skip
        yield _counter("polar_gateway_sessions_finished", "Sessions finished, by status", ["status"],
                       [((status,), n) for status, n in sorted(sessions["finished"].items())])  # fmt: skip
        yield _gauge("polar_gateway_sessions_active", "Sessions submitted and not finished",
                     samples=[((), sessions["active"])])  # fmt: skip
        yield _gauge("polar_gateway_stage_queued", "Sessions waiting for a stage's worker (ready: the READY buffer)",
                     ["stage"], [((stage,), stages[stage]["queued"]) for stage in QUEUES])  # fmt: skip
        yield _gauge("polar_gateway_stage_in_flight", "Sessions a stage's workers hold now", ["stage"],
                     [((stage,), stages[stage]["in_flight"]) for stage in WORKERS])  # fmt: skip
        yield _gauge("polar_gateway_stage_capacity", "Workers per stage (ready: the READY buffer's size)", ["stage"],
                     [((stage,), stages[stage]["capacity"]) for stage in CAPACITIES])  # fmt: skip
        yield _gauge("polar_gateway_ready_blocked", "Sessions done with INIT waiting for room in the READY buffer",
                     samples=[((), stages["ready"]["blocked"])])  # fmt: skip
        yield _counter("polar_gateway_run_slot_busy_seconds", "Run-slot seconds spent running harnesses "
                       "(utilization: rate over polar_gateway_stage_capacity{stage=\"running\"})",
                       samples=[((), m["run_slots"]["busy_seconds"])])  # fmt: skip


# ---- the rollout server --------------------------------------------------------------------------------------------


@dataclass
class ServerReading:
    """What the server's collector exports at scrape time: the database's counts (read off the event loop before the
    scrape renders) and the live state."""

    sessions: Mapping[str, int] = field(default_factory=dict)
    tasks: Mapping[str, int] = field(default_factory=dict)
    pending_callbacks: int = 0
    nodes: list[tuple[bool, bool]] = field(default_factory=list)
    """(healthy, draining) per registered node."""
    policy_version: int = 0
    paused: bool = False


CALLBACK_KINDS = ("session_result", "task_status")
CALLBACK_RESULTS = ("delivered", "failed")


class ServerMetrics:
    """Tasks, sessions, results, trainer callbacks, nodes, and the policy version on the rollout server."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or new_registry()
        r = self.registry
        self.tasks_submitted = Counter("polar_server_tasks_submitted", "Tasks created (a repeated submission is not)",
                                       registry=r)  # fmt: skip
        self.sessions_finished = Counter(
            "polar_server_sessions_finished", "Session results committed, by status", ["status"], registry=r
        )
        self.dispatches = Counter("polar_server_session_dispatches", "Session attempts dispatched to gateways",
                                  registry=r)  # fmt: skip
        self.requeues = Counter(
            "polar_server_session_requeues", "Session attempts lost (node dead or restarted, or it cancelled the "
            "session) and queued again", registry=r,
        )  # fmt: skip
        self.callbacks = Counter(
            "polar_server_callbacks", "Trainer callback POSTs, by kind and result (delivered, failed)",
            ["kind", "result"], registry=r,
        )  # fmt: skip
        for kind in CALLBACK_KINDS:  # at 0 from the start: a dashboard's panel has data before the first callback
            for result in CALLBACK_RESULTS:
                self.callbacks.labels(kind, result)
        self.reading = ServerReading()
        self._read: Callable[[], Awaitable[ServerReading]] | None = None
        r.register(_Reader(self._collect))

    def watch(self, read: Callable[[], Awaitable[ServerReading]]) -> None:
        """``read()`` is awaited before each scrape renders (see :class:`Exposition`)."""
        self._read = read

    async def refresh(self) -> None:
        if self._read is not None:
            self.reading = await self._read()

    def _collect(self) -> Iterable[Metric]:
        s = self.reading
        yield _gauge("polar_server_sessions", "Sessions by state (pending, dispatched, running, finished, cancelled)",
                     ["state"], [((state,), n) for state, n in sorted(s.sessions.items())])  # fmt: skip
        yield _gauge("polar_server_tasks", "Tasks by state", ["state"],
                     [((state,), n) for state, n in sorted(s.tasks.items())])  # fmt: skip
        yield _gauge("polar_server_callbacks_pending", "Trainer callbacks not yet acknowledged",
                     samples=[((), s.pending_callbacks)])  # fmt: skip
        counts: dict[tuple[str, str], int] = {}
        for healthy, draining in s.nodes:
            key = ("true" if healthy else "false", "true" if draining else "false")
            counts[key] = counts.get(key, 0) + 1
        yield _gauge("polar_server_nodes", "Registered gateway nodes by health and draining", ["healthy", "draining"],
                     sorted(counts.items()))  # fmt: skip
        yield _gauge("polar_server_policy_version", "The policy version the server holds (what gateways sample under)",
                     samples=[((), s.policy_version)])  # fmt: skip
        yield _gauge("polar_server_inference_paused", "1 while the trainer has sampling paused",
                     samples=[((), float(s.paused))])  # fmt: skip


# ---- exposition ----------------------------------------------------------------------------------------------------


@dataclass
class Exposition:
    """One component's registry and what must be refreshed before it renders (state read off the event loop)."""

    registry: CollectorRegistry
    refresh: Callable[[], Awaitable[None]] | None = None

    async def render(self) -> bytes:
        if self.refresh is not None:
            await self.refresh()
        return bytes(generate_latest(self.registry))


async def render_all(expositions: Iterable[Exposition]) -> bytes:
    """Several components' metrics as one text document (their metric names never clash: each has its prefix)."""
    return b"".join([await e.render() for e in expositions])
