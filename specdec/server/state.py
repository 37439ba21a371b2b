"""What the server holds for its whole life (:class:`ServerState`): the models, the configuration, the
load policy, the metrics, the request counts and the model thread."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass, field

from specdec.api import LoadedModel
from specdec.chunking import shared_prefill_chunk
from specdec.config import SpecConfig
from specdec.policy import BatchPolicy, LoadAverage, requests_now
from specdec.server.params import CHAT_DEFAULT_MAX_TOKENS, RETRY_AFTER_S, APIError
from specdec.server.audit import Auditor
from specdec.server.executor import ModelExecutor
from specdec.server.metrics import Metrics
from specdec.server.security import AccessPolicy, CorsPolicy
from specdec.server.stats_log import ThroughputWindow


@dataclass
class ServerState:
    target: LoadedModel
    model_name: str
    draft: LoadedModel | None = None
    spec: SpecConfig = field(default_factory=SpecConfig)
    max_concurrency: int = 8
    max_queue: int = 64
    #: how much requests may draft at the server's load (policy.py: --disable-speculation-above)
    policy: BatchPolicy = field(default_factory=BatchPolicy)
    #: chunked prefill: prompt tokens per target call (0: whole prompts; engine.generate_steps) …
    prefill_chunk: int = 0
    #: … and for a long prompt while other requests decode, when smaller (0: always prefill_chunk;
    #: chunking.SHARED_PREFILL_CHUNK): a prompt pass of more than long_prompt_tokens
    shared_prefill_chunk: int = 0
    long_prompt_tokens: int = 1024
    #: running requests draft nothing while a new one waits for its prompt pass (Batcher.prompt_pending)
    pause_speculation_for_prompts: bool = True
    #: request limits (None: only the context window bounds them): prompt tokens, max_tokens
    max_prompt_tokens: int | None = None
    max_tokens_limit: int | None = None
    #: a chat request's max_tokens when it sends none (None: the rest of the context, as OpenAI and vLLM)
    chat_default_max_tokens: int | None = CHAT_DEFAULT_MAX_TOKENS
    #: API keys and the body size limit, enforced before routing (server/security.py)
    access: AccessPolicy = field(default_factory=AccessPolicy)
    #: which browser pages may read the answers (server/security.py: vLLM's --allowed-origins …)
    cors: CorsPolicy = field(default_factory=CorsPolicy)
    #: fraction of finished greedy requests re-decoded plainly when idle (server/audit.py)
    audit_fraction: float = 0.0
    auditor: Auditor | None = None  # made by create_app
    metrics: Metrics = field(default_factory=Metrics)
    active: int = 0
    #: sequences waiting for a slot (the gauge); ``queued``: the requests among them not yet admitted (--max-queue)
    waiting: int = 0
    queued: int = 0
    #: recent active + waiting requests, what --disable-speculation-above is read against (policy.py)
    load: LoadAverage = field(default_factory=LoadAverage)
    slots: asyncio.Semaphore | None = None
    #: the thread that loaded the models and runs every step (see server/executor.py)
    executor: ModelExecutor = field(default_factory=ModelExecutor)
    #: which process answered (header ``x-specdec-instance``, /health): tells replicas apart behind a proxy
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    #: --log-stats-interval: seconds between throughput lines while serving (0: none; server/stats_log.py)
    stats_interval_s: float = 0.0
    throughput: ThroughputWindow = field(default_factory=ThroughputWindow)
    #: --enable-log-requests: one log line per request (server/request_log.py)
    log_requests: bool = False
    #: --max-log-len: characters of each prompt the request log shows (None: all, 0: none)
    max_log_len: int | None = None
    #: echo the client's ``x-request-id`` in the response (False under Ray Serve, whose proxy echoes it: it came twice)
    echo_request_id: bool = True
    #: when the model was loaded (Unix seconds): /v1/models' ``created``
    created: int = field(default_factory=lambda: int(time.time()))

    def next_prefill_chunk(self, remaining: int, total: int) -> int:
        """A request's next prompt chunk, ``remaining`` of its prompt pass's ``total`` tokens still to feed: smaller
        for a long prompt while other requests decode, whose every token waits for the forward that carries it
        (asked on the model thread, before each chunk: engine.prompt_pass; the rule: chunking.shared_prefill_chunk)."""
        rule = shared_prefill_chunk(self.prefill_chunk, self.executor.others_in_flight, self.shared_prefill_chunk, self.long_prompt_tokens)
        return rule(remaining, total)

    def speculation_cap(self) -> int | None:
        """The most tokens a request may draft now (0: none; None: no cap): policy.py, read against
        the larger of the requests active now and the recent average."""
        return self.policy.cap(requests_now(self.active, self.load))

    def speculation_saving(self) -> float | None:
        """Seconds per token speculating saves at the current load (BatchPolicy.saving)."""
        return self.policy.saving(requests_now(self.active, self.load))

    def reset_prefix_caches(self) -> int | None:
        """Empty the target's and the draft model's prefix caches (run it on the model thread);
        the blocks dropped, or None where no model has one."""
        caches = [model.backend.prefix_cache for model in (self.target, self.draft)
                  if model is not None and model.backend.prefix_cache is not None]
        return sum(cache.reset() for cache in caches) if caches else None

    def count_requests(self) -> None:
        """After ``active`` or ``waiting`` moved: the gauges and the load average."""
        self.metrics.active.set(self.active)
        self.metrics.waiting.set(self.waiting)
        self.load.set(self.active + self.waiting)

    async def acquire_slot(self, admitted: bool = False) -> None:
        """Wait for a concurrency slot (--max-concurrency), or refuse with 429 where the queue (--max-queue) is full.
        ``admitted``: a later choice of a request already let in, which waits without taking a queue place (a
        running n=4 request held 3 places, and the next request was refused with nothing else waiting)."""
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.max_concurrency)
        if not admitted and self.slots.locked() and self.queued >= self.max_queue:
            raise APIError(429, "server busy: the request queue is full, retry later", kind="rate_limit_error",
                           code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
        self.waiting += 1
        self.queued += not admitted
        self.count_requests()
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
            self.queued -= not admitted
            self.count_requests()
        self.active += 1
        self.count_requests()

    def slot_free(self) -> bool:
        """Whether a request would get a concurrency slot now, without waiting."""
        return self.slots is None or not self.slots.locked()

    def release_slot(self) -> None:
        """A slot's request ended (or failed to start): the next waiting one may run."""
        self.active -= 1
        self.count_requests()
        assert self.slots is not None
        self.slots.release()
