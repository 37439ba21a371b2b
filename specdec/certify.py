"""`specdec verify`: the lossless certificate.

Two checks for every registered drafter:

(a) **greedy identity** — on real prompts with the real model pair, speculative greedy output must be
    token-for-token identical to plain greedy decoding *in the same dtype and kernels*;
(b) **distribution** — on a tiny random model with a small vocabulary (so every outcome can be
    enumerated), the joint distribution of the first generated tokens under speculative sampling
    must equal the target's exact distribution, computed by enumerating every prefix. A Pearson χ²
    test with significance ``alpha`` decides; its false-alarm rate per row is ``alpha``.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from specdec.backends.torch_backend import TorchBackend
from specdec.bench.datasets import PromptRow
from specdec.config import DEFAULT_SPEC_TREE, SpecConfig
from specdec.drafters.base import DrafterResources
from specdec.drafters.draft_suffix import SuffixAssistedDrafter
from specdec.drafters.registry import build_drafter, method_info, method_names
from specdec.engine import generate_ids
from specdec.models.config import ModelConfig
from specdec.models.head_files import head_kind_phrase, read_head_config
from specdec.models.transformer import Decoder
from specdec.sampling import SamplingParams, logits_to_probs, make_generator
from specdec.penalties import Penalties
from specdec.stats_tests import chi_square_pvalue
from specdec.structured import INSTALL_HINT, GrammarConstraint, StructuredOutput, compile_for_vocab
from specdec.structured import available as structured_available

#: methods that draft with a trained head (``--drafter-path``): certified on the real pair only when
#: one is given; the distribution test gives the tiny model an untrained one
TRAINED_HEADS = ("eagle", "medusa")
#: sampling configurations of the distribution test (greedy is exercised by check (a))
DISTRIBUTION_CONFIGS: dict[str, SamplingParams] = {
    "T=1": SamplingParams(temperature=1.0),
    "T=0.7,top-k=4": SamplingParams(temperature=0.7, top_k=4),
    "T=1,top-p=0.8": SamplingParams(temperature=1.0, top_p=0.8),
    # structured output: a regex over the tiny vocabulary (token i is the letter "abcdefgh"[i]) whose
    # mask changes at every position, so drafts are often refused and p, q are masked differently; its
    # second position allows "b", which the prompt's n-grams propose after "…cd" (with "a" there instead
    # the prompt-lookup drafters proposed nothing the grammar allowed: the check did not test them)
    "T=1,regex": SamplingParams(temperature=1.0, structured=StructuredOutput(regex="[bcd](b|[e-h])[aceg]")),
    # penalties and a logit bias: each row's logits depend on the tokens drafted before it (the
    # prompt repeats tokens 1-3, so the repetition penalty acts from the first token on)
    "T=1,penalties": SamplingParams(temperature=1.0, repetition_penalty=1.6, frequency_penalty=0.8,
                                    presence_penalty=0.5, logit_bias={0: -1.5, 5: 1.0}),
    # a predicted output (token ids): the suffix drafters draft from it (its first token follows the
    # prompt's tail), the others ignore it — the target's distribution either way
    "T=1,prediction": SamplingParams(temperature=1.0, prediction=[3, 1, 2, 0, 3, 1]),
    # seeded requests (sample i seeded seed + i): each token the target's own seeded choice at its
    # position, drafts accepted when they are that choice (specdec.seeded), not rejection sampling
    "T=1,seeded": SamplingParams(temperature=1.0, seed=0),
}
#: draft_suffix's prompt: "1 2 x y" for even x, ending "1 2", so the suffix table's match is long enough to be
#: trusted after about half the first tokens (even ones) and the draft model drafts after the rest — both of the
#: method's kinds of rounds in one test (after the common prompt the table was never trusted at top-k 4)
TABLE_PROMPT = [token for x in (0, 2, 4, 6) for token in (1, 2, x, (x + 3) % 8)] + [1, 2]
#: the tiny model's vocabulary as text, for grammars (see the "regex" configuration)
TINY_VOCAB = list("abcdefgh")
#: the default (quick) run's one configuration: top-k keeps 64 outcomes of 3 tokens, so each cell
#: gets ~15 of the default 1000 samples — a real test in seconds; ``--thorough`` runs all three at 10000
QUICK_CONFIGS = ("T=0.7,top-k=4",)


@dataclass
class CheckResult:
    check: str  # "greedy-identity" | "distribution"
    method: str
    config: str
    passed: bool
    detail: str
    seconds: float = 0.0
    #: not run, for the reason in ``detail`` (a trained head's method without a head of its kind): a
    #: row of its own, so a certificate never reads as covering a method it did not check
    skipped: bool = False


def tiny_model(vocab: int = 8, seed: int = 0, scale: float = 0.2, device: str = "cpu") -> TorchBackend:
    """A 2-layer random Qwen2-shaped model with a tiny vocabulary and peaked distributions (weights
    drawn on the CPU, so a seed gives the same model on every device)."""
    cfg = ModelConfig(arch="qwen2", vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64, rope_theta=10000.0,
                      attention_bias=True)
    torch.manual_seed(seed)
    decoder = Decoder(cfg)
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            param.copy_(1.0 + 0.1 * torch.randn_like(param) if "norm" in name else scale * torch.randn_like(param))
    return TorchBackend(decoder.eval().to(device))


def exact_joint(target: TorchBackend, prompt: list[int], params: SamplingParams, length: int,
                constraint: GrammarConstraint | None = None) -> dict[tuple[int, ...], float]:
    """P(first ``length`` tokens) under plain sampling, by enumerating every prefix (each prefix's
    logits masked by ``constraint``'s grammar after it, when given, and penalised after it when
    ``params`` sets penalties)."""
    penalties = Penalties.build(params, prompt, target.config.vocab_size, params.stop_token_ids)
    result: dict[tuple[int, ...], float] = {}
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for _ in range(length):
        next_frontier = []
        for prefix, mass in frontier:
            state = target.new_state(len(prompt) + length + 1)
            logits = target.forward(state, prompt + list(prefix), num_logits=1)[-1]
            if constraint is not None:
                logits = constraint.mask_logits(logits, list(prefix))
            if penalties is not None:
                logits = penalties.apply(logits, list(prefix))
            probs = logits_to_probs(logits, params)
            for token in probs.nonzero().flatten().tolist():
                next_frontier.append((prefix + (token,), mass * float(probs[token])))
        frontier = next_frontier
    for prefix, mass in frontier:
        result[prefix] = mass
    return result


def _tiny_datastore(scratch: Path) -> str:
    """A datastore over a few token sequences of the tiny model's vocabulary (for `retrieval`), in ``scratch``."""
    from specdec.drafters.retrieval import SEPARATOR, write_datastore

    path = scratch / "datastore"
    # and every pair of tokens with two that follow it: any context has a match to draft from (without
    # them, under top-k / top-p the likely first tokens had none and nothing was drafted)
    every_pair = [token for a in range(8) for b in range(8) for token in (a, b, (a + b) % 8, (a * b + 1) % 8, SEPARATOR)]
    corpus = [1, 2, 3, 4, 5, SEPARATOR, 2, 3, 1, 2, 6, SEPARATOR, 3, 1, 2, 3, 7, 0, SEPARATOR, *every_pair]
    write_datastore(corpus, path, fingerprint="tiny", vocab_size=8)
    return str(path)


def distribution_check(method: str, config_name: str, params: SamplingParams, samples: int, gamma: int = 2,
                       length: int = 3, alpha: float = 1e-3, seed: int = 0, spec_options: dict | None = None,
                       device: str = "cpu", prompt: list[int] | None = None) -> CheckResult:
    """χ² of the joint distribution of the first ``length`` tokens after ``prompt`` (default: a repetitive one,
    so n-gram drafters propose; draft_suffix's :data:`TABLE_PROMPT`), speculative vs exact. Runs on one thread:
    the tiny model's ops are too small to share, and a second OpenMP thread only spins. What a method needs on
    disk (an untrained head, a datastore) lives in a directory removed after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="specdec-verify-") as scratch:
            if prompt is None:
                prompt = TABLE_PROMPT if method == "draft_suffix" else [1, 2, 3, 1, 2, 3, 1, 2]
            return _distribution_check(method, config_name, params, samples, gamma, length, alpha, seed, spec_options,
                                       device, Path(scratch), prompt)
    finally:
        torch.set_num_threads(threads)


def _distribution_check(method: str, config_name: str, params: SamplingParams, samples: int, gamma: int,
                        length: int, alpha: float, seed: int, spec_options: dict | None, device: str,
                        scratch: Path, prompt: list[int]) -> CheckResult:
    start = time.perf_counter()
    target, draft = tiny_model(seed=seed, device=device), tiny_model(seed=seed + 1, device=device)
    grammar = None if params.structured is None else compile_for_vocab(params.structured, TINY_VOCAB, [])
    new_constraint = (lambda: None) if grammar is None else (lambda: GrammarConstraint(grammar, len(TINY_VOCAB)))
    exact = exact_joint(target, prompt, params, length, new_constraint())
    options = dict(spec_options or {})
    if method in TRAINED_HEADS and not options.get("drafter_path"):
        options["drafter_path"] = _tiny_head(target, method, seed, scratch)
    spec = SpecConfig(method=None if method == "ar" else method, num_speculative_tokens=gamma,
                      datastore=_tiny_datastore(scratch) if method == "retrieval" else None, **options)
    run_params = SamplingParams(**{**params.__dict__, "max_tokens": length, "ignore_eos": True})
    generator = make_generator(seed, device)
    counts: dict[tuple[int, ...], int] = {}
    proposed = accepted = 0
    table_rounds = model_rounds = 0  # a table-assisted draft model's rounds of each kind
    for sample in range(samples):
        drafter, constraint = None, new_constraint()
        if params.seed is not None:  # a seeded configuration: every sample a request of its own seed
            run_params = dataclasses.replace(run_params, seed=params.seed + sample)
        if spec.method is not None:
            info = method_info(spec.method)
            drafter = build_drafter(info, DrafterResources(
                target_backend=target, spec=spec, params=run_params, generator=generator,
                max_seq_len=len(prompt) + length + gamma + 2, draft_backend=draft if info.needs_draft_model else None,
                constraint=constraint, prediction_ids=tuple(run_params.prediction or ())))
        out = generate_ids(target, prompt, run_params, drafter, spec, None, generator, constraint)
        if isinstance(drafter, SuffixAssistedDrafter):
            table_rounds, model_rounds = table_rounds + drafter.suffix_rounds, model_rounds + drafter.draft_rounds
        key = tuple(out.token_ids)
        counts[key] = counts.get(key, 0) + 1
        proposed, accepted = proposed + out.stats.proposed_tokens, accepted + out.stats.accepted_tokens
    outside = sum(c for k, c in counts.items() if k not in exact)
    cells = sorted(exact)
    p_value = chi_square_pvalue([counts.get(c, 0) for c in cells], [exact[c] for c in cells])
    # a method that drafted nothing (or had nothing accepted, or nothing refused) left the rule under test
    # unexercised: plain decoding's samples pass any χ² test
    unexercised = spec.method is not None and not 0 < accepted < proposed
    # draft_suffix's rounds are the table's (point masses) or the draft model's (its q, also certified as draft_model):
    # with the common prompt only the draft model ever drafted here, and the certificate said PASS for a path it never ran
    one_part = method == "draft_suffix" and not table_rounds
    passed = outside == 0 and p_value > alpha and not unexercised and not one_part
    detail = (f"χ² p={p_value:.3g} over {len(cells)} outcomes, {samples} samples, {proposed} drafted, {accepted} accepted"
              + (f" ({table_rounds} table rounds, {model_rounds} draft-model rounds)" if table_rounds + model_rounds else "")
              + (f", {outside} impossible outcomes" if outside else "")
              + (": the drafts did not exercise both acceptance and rejection" if unexercised else "")
              + (": the suffix table never drafted" if one_part else ""))
    return CheckResult("distribution", method, config_name, passed, detail, time.perf_counter() - start)


def _tiny_head(target: TorchBackend, kind: str, seed: int, scratch: Path) -> str:
    """An untrained head of ``kind`` for the tiny model (random, so its proposals differ from the
    target's often: the sampling test needs rejections), saved in ``scratch`` for the drafter to load."""
    from specdec.models.head_files import save_head
    from specdec.models.heads import EagleHead, HeadConfig, MedusaHeads

    torch.manual_seed(seed + 2)
    config = HeadConfig.for_target(target.config, draft_vocab_size=0, kind=kind, num_medusa_heads=4)
    head = (EagleHead(config) if kind == "eagle" else MedusaHeads(config)).init_residual(scale=0.3)
    return str(save_head(head, scratch / f"tiny-{kind}"))


def guarded(check: str, method: str, config: str, run: Callable[[], CheckResult]) -> CheckResult:
    """``run()``'s result, or a FAIL row saying what the method raised: a method whose code fails (a plugin's
    factory, its propose) fails its own rows, and the other methods' rows are still certified and printed."""
    start = time.perf_counter()
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - any failure of the method's code is its row's verdict
        return CheckResult(check, method, config, False, f"error: {type(exc).__name__}: {exc}", time.perf_counter() - start)


def greedy_identity_check(method: str, run_plain: Callable, run_spec: Callable, prompts: Iterable[tuple[str, list[int]]], dtype: str,
                          config: str = "") -> CheckResult:
    """Token identity of speculative vs plain greedy decoding on real prompts (``run_plain`` may
    return a cached result: plain decoding does not depend on the method)."""
    start = time.perf_counter()
    total, mismatches, first_bad = 0, 0, ""
    accepted = proposed = 0
    for prompt_id, ids in prompts:
        plain, spec = run_plain(ids), run_spec(ids)
        total += 1
        accepted += spec.stats.accepted_tokens
        proposed += spec.stats.proposed_tokens
        if plain.token_ids != spec.token_ids:
            mismatches += 1
            if not first_bad:
                at = next((i for i, (a, b) in enumerate(zip(plain.token_ids, spec.token_ids)) if a != b), min(len(plain.token_ids), len(spec.token_ids)))
                first_bad = f"; first mismatch: prompt {prompt_id} at token {at}"
    alpha = accepted / proposed if proposed else 0.0
    detail = f"{total - mismatches}/{total} prompts identical ({dtype}), acceptance {alpha:.2f}{first_bad}"
    return CheckResult("greedy-identity", method, f"greedy {dtype}{f', {config}' if config else ''}", mismatches == 0, detail,
                       time.perf_counter() - start)


def registered_methods() -> list[str]:
    return method_names()


def format_table(results: list[CheckResult]) -> str:
    rows = [("CHECK", "METHOD", "CONFIG", "RESULT", "DETAIL")] + [
        (r.check, r.method, r.config, "SKIP" if r.skipped else "PASS" if r.passed else "FAIL", r.detail) for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row[:4], widths)), row[4]]) for row in rows)


def _humaneval_datastore(target, scratch: str, data_dir: Path | None = None) -> str:  # noqa: ANN001 - LoadedModel
    """Retrieval needs a corpus: HumanEval prompts with their reference solutions (in ``scratch``,
    removed when the certificate ends: each run left one behind in /tmp)."""
    from specdec.bench.datasets import load_prompts
    from specdec.drafters.retrieval import build_datastore

    path = str(Path(scratch) / "humaneval-datastore")
    texts = [row.meta["prompt"] + row.meta["canonical_solution"] for row in load_prompts("humaneval", data_dir=data_dir)]
    build_datastore(target.tokenizer, texts, Path(path))
    return path


def default_rows(count: int, data_dir: Path | None = None) -> list[PromptRow]:
    """The greedy check's own prompts: half HumanEval (raw completion), half MT-Bench first turns (chat template)."""
    from specdec.bench.datasets import load_prompts

    return (load_prompts("humaneval", limit=(count + 1) // 2, data_dir=data_dir)
            + load_prompts("spec_bench", categories=["mt_bench"], limit=count // 2, data_dir=data_dir))


def real_prompts(target, prompts: int | list[PromptRow]) -> list[tuple[str, list[int]]]:  # noqa: ANN001 - LoadedModel
    """``prompts``: a count of :func:`default_rows`, or the rows of a user's dataset (``verify --dataset``: a logged
    request's system prompt and history included), encoded for ``target``."""
    from specdec.api import encode_prompt

    rows = default_rows(prompts) if isinstance(prompts, int) else prompts
    return [(row.id, encode_prompt(target, row.first_prompt(), chat=row.chat)) for row in rows]


def run_certificate(target, draft, methods: list[str], prompts: int | list[PromptRow], max_tokens: int, samples: int,  # noqa: ANN001
                    alpha: float = 1e-3, gamma: int = 4, greedy: bool = True, distribution: bool = True,
                    progress: Callable[[str], None] | None = None,
                    configs: Iterable[str] = tuple(DISTRIBUTION_CONFIGS), spec_tree: str | int = DEFAULT_SPEC_TREE,
                    drafter_path: str | None = None, options: dict | None = None,
                    data_dir: Path | None = None) -> list[CheckResult]:
    """Run both checks for every method; ``target``/``draft`` are LoadedModels (draft may be None: the methods
    that need one are skipped); ``prompts``: how many built-in prompts the greedy check runs, or its rows.
    ``progress(message)`` is called before each check; ``configs`` names the distribution test's
    sampling configurations (keys of :data:`DISTRIBUTION_CONFIGS`); ``spec_tree`` certifies token
    trees for the methods that branch (``--spec-tree``; the default's: trees under greedy, chains under
    sampling). ``drafter_path``: the trained head
    certified for ``eagle``/``medusa`` (of that kind) on the real pair (without one their greedy check is skipped, said through
    ``progress``; its distribution check uses an untrained head on the tiny model). ``options``: SpecConfig
    settings the greedy check runs each method with (a datastore, a skip set …: the configuration a user
    deploys; the tiny model's distribution check keeps its own). ``data_dir``: where the named datasets live (the
    default prompts' and retrieval's HumanEval corpus)."""
    from specdec.api import make_drafter
    from specdec.drafters.suffix import clear_global_caches

    results: list[CheckResult] = []
    say = progress or (lambda _msg: None)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    prompt_ids = real_prompts(target, prompts) if greedy else []
    plain_results: dict[tuple[int, ...], object] = {}  # plain decoding once per prompt, not per method
    configs = [c for c in configs if c in DISTRIBUTION_CONFIGS]
    if not structured_available():  # the structured extra is not installed: say so, certify the rest
        skipped = [c for c in configs if DISTRIBUTION_CONFIGS[c].structured is not None]
        configs = [c for c in configs if c not in skipped]
        if skipped:
            say(f"skipping {', '.join(skipped)}: {INSTALL_HINT}")
    head_kind = read_head_config(drafter_path).kind if drafter_path else None  # a clear error for a folder without one
    with tempfile.TemporaryDirectory(prefix="specdec-verify-") as scratch:  # retrieval's datastore, removed at the end
        for method in methods:
            why = None  # the greedy check cannot run this method on the real pair
            if method in TRAINED_HEADS and method != head_kind:
                why = (f"needs --drafter-path (a trained {method} head)" if head_kind is None
                       else f"--drafter-path holds {head_kind_phrase(head_kind)}, not {head_kind_phrase(method)}")
            elif draft is None and method_info(method).needs_draft_model:
                why = "needs a draft model (--draft-model; the --config file's choice runs none)"
            if greedy and why is not None:
                say(f"skipping {method}'s greedy identity on the real pair: {why}")
                results.append(CheckResult("greedy-identity", method, "greedy", True, f"skipped: {why}", skipped=True))
            elif greedy:
                say(f"greedy identity: {method} on {len(prompt_ids)} prompts")
                given = {key: value for key, value in (options or {}).items() if key in method_info(method).options}
                if method == "retrieval" and not given.get("datastore"):
                    given["datastore"] = _humaneval_datastore(target, scratch, data_dir)
                spec = SpecConfig(method=method, num_speculative_tokens=gamma, spec_tree=spec_tree,
                                  drafter_path=drafter_path if method in TRAINED_HEADS else None,
                                  **{key: value for key, value in given.items() if key != "drafter_path"})
                defaults = SpecConfig()
                config = ", ".join([f"γ={gamma}", f"tree={spec_tree}"] + [
                    f"{key}={Path(value).name if key == 'datastore' else value}" for key, value in given.items()
                    if key != "drafter_path" and value != getattr(defaults, key)])

                def run_spec(ids: list[int], spec: SpecConfig = spec) -> object:
                    clear_global_caches()  # suffix drafting from earlier methods' answers to this prompt accepted ~all
                    generator = make_generator(0)
                    drafter = make_drafter(target, spec, params, generator, len(ids) + max_tokens + gamma + 1, draft)
                    return generate_ids(target.backend, ids, params, drafter, spec, target.tokenizer, generator)

                def run_plain(ids: list[int]) -> object:
                    key = tuple(ids)
                    if key not in plain_results:
                        plain_results[key] = generate_ids(target.backend, ids, params, None, SpecConfig(), target.tokenizer,
                                                          make_generator(0))
                    return plain_results[key]

                results.append(guarded("greedy-identity", method, "greedy", lambda: greedy_identity_check(
                    method, run_plain, run_spec, prompt_ids, target.backend.dtype_name, config)))
            if distribution:
                for name in configs:
                    say(f"distribution: {method} {name}, {samples} samples")
                    results.append(guarded("distribution", method, name, lambda: distribution_check(
                        method, name, DISTRIBUTION_CONFIGS[name], samples, alpha=alpha, spec_options={"spec_tree": spec_tree})))
    return results
