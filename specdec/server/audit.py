"""Online losslessness audit: re-decode finished greedy requests plainly and compare token ids.

Why: exactness is the product, and greedy outputs that silently diverge under speculation are a
recurring bug class in every engine. A user can run ``specdec verify`` once; this checks the
traffic the server actually serves. ``--audit-fraction F`` samples finished greedy requests and
re-decodes them with plain decoding (same prompt ids, same sampling parameters, no drafter) **only
while the server is idle**: an audit in progress is dropped at its next step as soon as a request
arrives and retried later, so audits take no throughput from users. A request may also ask for its
own proof (``"speculative": {"audit": true}``): it is re-decoded at once and answers
``usage.speculative.audit: "identical"`` (or ``"mismatch"``).

A mismatch is logged (logger ``specdec.audit``) with the request id and both continuations, and
counted in ``/metrics`` (``specdec_audit_total{result=...}``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, Callable

from specdec.api import LoadedModel, prepare
from specdec.config import SpecConfig
from specdec.engine import generate_steps
from specdec.sampling import SamplingParams
from specdec.server.executor import END, ModelExecutor
from specdec.server.metrics import Metrics

logger = logging.getLogger("specdec.audit")

#: sampled audits waiting for an idle moment; more are counted as skipped, not queued
MAX_PENDING = 64
#: an audit interrupted by traffic this many times is given up (counted as skipped)
MAX_ATTEMPTS = 5


class AuditInterrupted(Exception):
    """The plain re-decode was dropped because requests arrived (background audits only)."""


@dataclass
class AuditCase:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    token_ids: list[int]  # what the speculative run emitted
    attempts: int = 0


def auditable(params: SamplingParams) -> bool:
    """Only greedy outputs are a deterministic function of the prompt: sampled ones are checked by
    the distribution test (``specdec verify``), not by comparing one draw."""
    return params.temperature == 0


def compare(case: AuditCase, plain_ids: list[int], decode: Callable[[list[int]], str]) -> str:
    """``"identical"`` or ``"mismatch"`` (logged with both continuations)."""
    if plain_ids == case.token_ids:
        return "identical"
    first = next((i for i, (a, b) in enumerate(zip(plain_ids, case.token_ids)) if a != b),
                 min(len(plain_ids), len(case.token_ids)))
    logger.warning("audit mismatch for request %s at token %d: speculative %r vs plain %r", case.request_id, first,
                   decode(case.token_ids), decode(plain_ids))
    return "mismatch"


class Auditor:
    """Samples finished requests, re-decodes them plainly on the model thread, records the result."""

    def __init__(self, target: LoadedModel, executor: ModelExecutor, metrics: Metrics, fraction: float = 0.0,
                 busy: Callable[[], bool] = lambda: False, seed: int | None = None) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"--audit-fraction must be in [0, 1], got {fraction}")
        self.target, self.executor, self.metrics = target, executor, metrics
        self.fraction, self.busy = fraction, busy
        self._rng = random.Random(seed)
        self._pending: asyncio.Queue[AuditCase] | None = None
        self._worker: asyncio.Task | None = None

    def finished(self, case: AuditCase) -> None:
        """A request finished (called on the event loop): audit it later with probability ``fraction``."""
        if not self.fraction or not auditable(case.params) or self._rng.random() >= self.fraction:
            return
        if self._pending is None:
            self._pending = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._background())
        if self._pending.qsize() >= MAX_PENDING:
            self.metrics.audits.labels("skipped").inc()
            return
        self._pending.put_nowait(case)

    async def audit_now(self, case: AuditCase) -> str:
        """Re-decode ``case`` plainly now (a request's own audit) and record the result."""
        result = compare(case, await self._plain_ids(case, interruptible=False), self.target.tokenizer.decode)
        self.metrics.audits.labels(result).inc()
        return result

    async def _background(self) -> None:
        assert self._pending is not None
        while True:
            case = await self._pending.get()
            while self.busy():
                await asyncio.sleep(0.05)
            try:
                plain = await self._plain_ids(case, interruptible=True)
            except AuditInterrupted:
                case.attempts += 1
                if case.attempts >= MAX_ATTEMPTS:
                    self.metrics.audits.labels("skipped").inc()
                else:
                    self._pending.put_nowait(case)
                continue
            except Exception:  # noqa: BLE001 - an audit must never take the server down
                logger.exception("audit of request %s failed", case.request_id)
                self.metrics.audits.labels("skipped").inc()
                continue
            self.metrics.audits.labels(compare(case, plain, self.target.tokenizer.decode)).inc()

    async def _plain_ids(self, case: AuditCase, interruptible: bool) -> list[int]:
        """Plain decoding of the case's prompt with its parameters, stepped on the model thread in
        turn with the requests (dropped at its next step when ``interruptible`` and a request is
        active)."""
        chunks = await self.executor.run(lambda: generate_steps(
            **prepare(self.target, case.prompt_ids, case.params, None, SpecConfig(), chat=False)))
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
        interrupted = False

        def cancelled() -> bool:
            nonlocal interrupted
            interrupted = interruptible and self.busy()
            return interrupted

        self.executor.add_stream(chunks, lambda item: loop.call_soon_threadsafe(items.put_nowait, item), cancelled)
        token_ids: list[int] = []
        complete = False
        while (item := await items.get()) is not END:
            if isinstance(item, BaseException):
                raise item
            token_ids.extend(item.token_ids)
            complete = item.finish_reason is not None
        if interrupted and not complete:
            raise AuditInterrupted(case.request_id)
        return token_ids
