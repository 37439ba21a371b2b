"""Prometheus metrics, one registry per app (so tests can run several apps in one process)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from specdec.forward_costs import Forward

if TYPE_CHECKING:
    from specdec.prefix_cache import PrefixCache

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60, 120)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # process_resident_memory_bytes, process_cpu_seconds_total…: what a deployment sizes replicas by
        ProcessCollector(registry=r)
        self.requests = Counter("specdec_requests_total", "Requests by endpoint and status", ["endpoint", "status"], registry=r)
        self.latency = Histogram("specdec_request_latency_seconds", "End-to-end latency of each sequence (a request with n choices observes n)", buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("specdec_time_to_first_token_seconds", "Time to first token of each sequence (a request with n choices observes n)", buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("specdec_time_per_output_token_seconds", "Time per output token after the first", buckets=TOKEN_BUCKETS, registry=r)
        self.prompt_tokens = Counter("specdec_prompt_tokens_total", "Prompt tokens processed (once per sequence: a request with n choices counts its prompt n times, its usage once)", registry=r)
        self.cached_prompt_tokens = Counter("specdec_prefix_cache_hit_tokens_total",
                                            "Prompt tokens whose keys/values came from the target's prefix cache", registry=r)
        self.generation_tokens = Counter("specdec_generation_tokens_total", "Tokens generated", registry=r)
        self.draft_tokens = Counter("specdec_spec_decode_num_draft_tokens_total", "Draft tokens proposed", ["method"], registry=r)
        self.accepted_tokens = Counter("specdec_spec_decode_num_accepted_tokens_total", "Draft tokens accepted", ["method"], registry=r)
        self.acceptance_rate = Gauge("specdec_spec_decode_acceptance_rate", "Draft tokens accepted / proposed since the "
                                     "server started, per method", ["method"], registry=r)
        self._drafted: dict[str, tuple[int, int]] = {}  # method → (proposed, accepted): the rate's totals
        self.traffic_acceptance = Gauge("specdec_traffic_acceptance_rate", "The server method's acceptance rate on this "
                                        "traffic as its gamma table plans with it (running requests' rounds, older ones "
                                        "forgotten; starts at a prior)", registry=r)
        self.active = Gauge("specdec_active_requests", "Sequences being generated (a request with n choices counts n, as each holds a --max-num-seqs slot)", registry=r)
        self.refused = Counter("specdec_refused_requests_total", "Requests refused before routing (missing or wrong API key, body too large)",
                               ["reason"], registry=r)
        self.audits = Counter("specdec_audit_total", "Greedy requests re-decoded plainly to check losslessness, by result "
                              "(identical, mismatch, skipped)", ["result"], registry=r)
        self.waiting = Gauge("specdec_waiting_requests", "Sequences waiting for a slot (a request's later choices wait for its earlier ones where n exceeds --max-num-seqs)", registry=r)
        self.batch_requests = Histogram("specdec_batch_requests", "Requests served by one target forward (continuous batching)",
                                        buckets=BATCH_BUCKETS, registry=r)
        self.batch_tokens = Histogram("specdec_batch_tokens", "Tokens (rows) of one target forward",
                                      buckets=(1, 4, 16, 64, 256, 1024, 4096), registry=r)

    def watch_prefix_caches(self, caches: dict[str, PrefixCache]) -> None:
        """Export the prefix caches' fill, budget, evictions and lookups per model ("target", "draft"), read at each
        scrape: with only the target's hit counter, eviction showed only as falling ``cached_tokens`` and the draft
        model's cache not at all (a hit rate: ``…_restored_tokens_total / …_queried_tokens_total``)."""
        if caches:
            self.registry.register(_PrefixCacheCollector(caches))

    def observe_forward(self, forward: Forward) -> None:
        """One batched forward; the target's are counted (called on the model thread; the client is
        thread-safe)."""
        if forward.role == "target":
            self.batch_requests.observe(forward.requests)
            self.batch_tokens.observe(forward.rows)

    def observe_cut(self, prompt_tokens: int, generated_tokens: int) -> None:
        """A request stopped before its end (its client left): the tokens it did process and generate, which
        the model spent time on though no final stats came (a token counter that missed them read as an idle
        server while it was busy with hung-up streams)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated_tokens)

    def observe(self, stats) -> None:  # noqa: ANN001 - specdec.stats.Stats
        self.ttft.observe(stats.ttft_s)
        if stats.generated_tokens > 1:
            self.tpot.observe(stats.tpot_s)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_prompt_tokens.inc(stats.cached_prompt_tokens)
        self.generation_tokens.inc(stats.generated_tokens)
        if stats.proposed_tokens:
            self.draft_tokens.labels(stats.method).inc(stats.proposed_tokens)
            self.accepted_tokens.labels(stats.method).inc(stats.accepted_tokens)
            proposed, accepted = self._drafted.get(stats.method, (0, 0))
            proposed, accepted = proposed + stats.proposed_tokens, accepted + stats.accepted_tokens
            self._drafted[stats.method] = (proposed, accepted)
            self.acceptance_rate.labels(stats.method).set(accepted / proposed)  # the last request's alone read 0.0


class _PrefixCacheCollector:
    """Reads the caches' plain-int counters when /metrics is scraped (they are written on the model thread)."""

    def __init__(self, caches: dict[str, PrefixCache]) -> None:
        self.caches = caches

    def collect(self) -> Iterator[Metric]:
        usage = GaugeMetricFamily("specdec_prefix_cache_usage_bytes", "Bytes of keys/values the prefix cache holds", labels=["model"])
        capacity = GaugeMetricFamily("specdec_prefix_cache_capacity_bytes", "The prefix cache's budget (--prefix-cache-gb)",
                                     labels=["model"])
        evicted = CounterMetricFamily("specdec_prefix_cache_evicted_blocks", "Blocks dropped to stay within the budget, least "
                                      "recently used first", labels=["model"])
        queried = CounterMetricFamily("specdec_prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache "
                                      "(the draft model's too: its own prompt passes)", labels=["model"])
        restored = CounterMetricFamily("specdec_prefix_cache_restored_tokens", "Of those, tokens whose keys/values the cache "
                                       "held", labels=["model"])
        for model, cache in self.caches.items():
            usage.add_metric([model], cache.nbytes)
            capacity.add_metric([model], cache.max_bytes)
            evicted.add_metric([model], cache.evicted_blocks)
            queried.add_metric([model], cache.queried_tokens)
            restored.add_metric([model], cache.hit_tokens)
        yield from (usage, capacity, evicted, queried, restored)
