"""Self-distillation data: the target's own continuations of prompts drawn from the training text.

Teacher forcing over library source (:mod:`specdec.train.data`) teaches a head what the target
predicts over *human* text; when speculating, the head drafts over the *target's* text, answering a
prompt — and a head trained on the stdlib reached top-1 0.42 on held-out stdlib but α 0.12 on
HumanEval (benchmarks/results/2026-11-26/session-23). EAGLE, Medusa-2 and DistillSpec all train on
target-generated data for that reason. Here the prompts come from the same documents: for Python
source, every function with a docstring as its module's imports plus the signature and docstring
(the shape of a code-completion request); for other text, each document's opening. The target
continues each greedily, many at a time (:func:`continue_greedily`: one batched forward per step,
~2.5 single steps' cost for 16 continuations on a CPU), and its cache records every fed row's
features as it goes: prompt + continuation, with the target's features and greedy tokens, are
training sequences at once — no second, teacher-forced pass (which took 21 of 51 data minutes when
the continuations were re-read). Shards and ``generated.jsonl`` rows are written as continuations
finish, so a cut run resumes where it stopped. Only training documents' prompts are continued; the
held-out documents' prompts are where the training report speculates (:func:`held_out_prompts`),
so α is measured on requests of the same shape the head learnt from, drawn from text it never saw;
the target's continuations of them are the held-out curve's data too (:func:`held_out_continuations`).
"""

from __future__ import annotations

import ast
import json
import random
import textwrap
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from specdec.errors import SpecdecError
from specdec.models.kv_cache import KVCache
from specdec.train.data import Document, shard_path, write_shard

#: tokens of a non-Python document's opening used as its prompt
TEXT_PROMPT_TOKENS = 64
#: a prompt longer than this is skipped (a long docstring leaves little to learn per token spent)
MAX_PROMPT_TOKENS = 384
#: continuations per shard (their rows are appended to the file after each)
BATCH_PROMPTS = 32
#: import lines of a module kept in front of its functions' prompts
MAX_IMPORT_LINES = 8


@dataclass(frozen=True)
class GenerationPrompt:
    name: str  # document name and, for a function, its line and name: the key a resumed run skips by
    text: str | None  # source text to encode; None when ``ids`` is given
    ids: tuple[int, ...] = ()


def function_prompts(doc: Document) -> list[GenerationPrompt]:
    """Every function (or method) with a docstring in a Python document, as the module's imports,
    then the function's decorators, signature and docstring, dedented: what a user asking for that
    function's body would send. [] when the document does not parse as Python."""
    try:
        tree = ast.parse(doc.text)
    except (SyntaxError, ValueError):
        return []
    lines = doc.text.splitlines()
    imports = [lines[node.lineno - 1] for node in tree.body  # one-line imports (a multi-line one is skipped)
               if isinstance(node, (ast.Import, ast.ImportFrom)) and node.end_lineno == node.lineno]
    header = "\n".join(imports[:MAX_IMPORT_LINES])
    prompts = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
            continue
        docstring = node.body[0]
        if len(node.body) < 2 or docstring.end_lineno is None:  # a docstring and nothing else: no body to learn
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        function = textwrap.dedent("\n".join(lines[first - 1 : docstring.end_lineno])) + "\n"
        text = f"{header}\n\n\n{function}" if header else function
        prompts.append(GenerationPrompt(f"{doc.name}:{node.lineno}:{node.name}", text))
    return prompts


def generation_prompts(docs: list[Document], encode: Callable[[str], list[int]], seed: int = 0) -> list[GenerationPrompt]:
    """The prompts of every document (:func:`function_prompts` for Python sources, else the first
    TEXT_PROMPT_TOKENS tokens), in a seeded random order so a time budget samples every kind."""
    prompts: list[GenerationPrompt] = []
    for doc in docs:
        if doc.name.endswith(".py"):
            prompts.extend(function_prompts(doc))
        else:
            ids = encode(doc.text)[:TEXT_PROMPT_TOKENS]
            if len(ids) == TEXT_PROMPT_TOKENS:
                prompts.append(GenerationPrompt(doc.name, None, tuple(ids)))
    random.Random(seed).shuffle(prompts)
    return prompts


def prompt_ids(docs: list[Document], encode: Callable[[str], list[int]], held_out: bool,
               seed: int = 0) -> list[tuple[GenerationPrompt, list[int]]]:
    """The prompts of one split with their token ids (those over MAX_PROMPT_TOKENS left out)."""
    result = []
    for prompt in generation_prompts([doc for doc in docs if doc.held_out == held_out], encode, seed):
        ids = list(prompt.ids) if prompt.text is None else encode(prompt.text)
        if 0 < len(ids) <= MAX_PROMPT_TOKENS:
            result.append((prompt, ids))
    return result


def held_out_prompts(docs: list[Document], encode: Callable[[str], list[int]], count: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of held-out documents, as token ids: where the report speculates."""
    return [ids for _, ids in prompt_ids(docs, encode, held_out=True, seed=seed)[:count]]


def read_generated(path: Path) -> list[dict]:
    """The rows a run wrote so far (a torn last line, from a cut run, is dropped)."""
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


@dataclass
class Continuation:
    """One prompt continued by the target: ``tokens`` (prompt, then the continuation); the rows the
    target was fed — every token but the last, which no forward needed — with their hidden states
    at the recorded layers ``features [T, hidden × layers]`` and the target's greedy token after
    each ``target_ids [T]`` (-1 where the prompt pass scored no logits: rows a training sequence's
    cut leaves out)."""

    index: int  # the prompt's, in the list given to continue_greedily
    tokens: list[int]
    prompt_tokens: int
    features: torch.Tensor
    target_ids: torch.Tensor


#: continuations in flight ``--generate-concurrency auto`` chooses among, and where nothing is measured
CONCURRENCY_CHOICES = (8, 16, 32, 64)
DEFAULT_CONCURRENCY = 16
#: the smallest concurrency making this share of the best expected rows per second is chosen (more in
#: flight holds more caches, and the curve beyond 32 rows is extrapolated)
CONCURRENCY_SHARE = 0.9


def auto_concurrency(backend, prompt_tokens: float, new_tokens: int) -> int:  # noqa: ANN001 - TorchBackend
    """How many continuations :func:`continue_greedily` should run at once on this machine: expected
    training rows per second for each of :data:`CONCURRENCY_CHOICES` from the target's measured step
    curve (a step of C rows moves C continuations on) and its prompt mode's per-row cost (each prompt's
    pass runs alone); the smallest within :data:`CONCURRENCY_SHARE` of the best. Why measured: 16
    was chosen on a Zen 4 EPYC; on a 2-core Xeon with AMX, whose int8 steps are nearly flat to 32 rows,
    64 made 1.5x the rows per minute of 16 (session 35). :data:`DEFAULT_CONCURRENCY` where the curves
    are unmeasured (float weights, CUDA)."""
    from specdec.cost_model import Curve
    from specdec.step_calibration import batch_curve, prompt_row_seconds

    steps = batch_curve(backend)
    if not steps or len(steps) < 2:
        return DEFAULT_CONCURRENCY
    step, prompt_row_s = Curve(backend.mode, steps), prompt_row_seconds(backend)

    def rows_per_second(concurrency: int) -> float:  # one continuation's rows over the time its slot takes
        return (prompt_tokens + new_tokens) / (prompt_tokens * prompt_row_s + new_tokens * step.cost(concurrency) / concurrency)

    rates = {c: rows_per_second(c) for c in CONCURRENCY_CHOICES}
    return min(c for c, rate in rates.items() if rate >= CONCURRENCY_SHARE * max(rates.values()))


@torch.inference_mode()
def continue_greedily(backend, prompts: list[list[int]], new_tokens: int, concurrency: int,  # noqa: ANN001 - TorchBackend
                      stop_ids: frozenset[int], scored_rows: int, layers: tuple[int, ...] = (),
                      admit: Callable[[], bool] = lambda: True) -> Iterator[Continuation]:
    """Continue ``prompts`` greedily — ``new_tokens`` each, or to a stop token — ``concurrency`` at a
    time, yielding each as it ends. Each prompt's pass runs alone (prompt passes are compute-bound:
    batching them gains nothing), then one ``Backend.forward_batch`` per step moves every running
    continuation on by a token: on a CPU with row-by-row kernels, 16 continuations' step costs ~2.5
    single steps. Every fed row's final hidden state is recorded by the target's cache, and each
    row's greedy token is the next one (the prompt's last ``scored_rows`` rows: the prompt pass's
    argmax), so the data needs no second, teacher-forced pass over the text — and the features are
    the decode steps' own, the ones an EAGLE head reads when it drafts. ``admit()`` False: start no
    further prompt (a time budget), finish the running ones. ``layers``: the target layers whose
    features are recorded (default: the final one)."""
    hidden = backend.config.hidden_size
    waiting = deque(enumerate(prompts))
    running: list[_Running] = []
    while waiting or running:
        while waiting and len(running) < concurrency:
            if not admit():
                waiting.clear()
                break
            index, ids = waiting.popleft()
            state = backend.new_state(len(ids) + new_tokens)
            state.record_features(hidden, layers)
            scored = min(len(ids), max(1, scored_rows))
            greedy = backend.prompt_backend.forward(state, ids, num_logits=scored).argmax(-1).tolist()
            running.append(_Running(index, list(ids) + [greedy[-1]], len(ids), state, [-1] * (len(ids) - scored) + greedy))
        for done in [r for r in running if len(r.tokens) - r.prompt_tokens >= new_tokens or r.tokens[-1] in stop_ids]:
            running.remove(done)
            yield Continuation(done.index, done.tokens, done.prompt_tokens,
                               done.state.features[: done.state.seq_len].to("cpu", copy=True),  # the storage is reused
                               torch.tensor(done.targets))
        if running:
            logits = backend.forward_batch([(r.state, r.tokens[-1:], 1, None) for r in running])
            for r, row in zip(running, logits):
                token = int(row[-1].argmax())
                r.tokens.append(token)
                r.targets.append(token)


@dataclass
class _Running:
    """A continuation under way: its tokens so far, its cache, and the greedy token after each fed row."""

    index: int
    tokens: list[int]
    prompt_tokens: int
    state: KVCache
    targets: list[int]


def generate_sequences(target, docs: list[Document], path: Path, shard_dir: Path, minutes: float,  # noqa: ANN001 - LoadedModel
                       new_tokens: int, layers: tuple[int, ...] = (), seq_len: int = 256, concurrency: int | None = None,
                       seed: int = 0, progress: bool = False, log: Callable[[str], None] = lambda _line: None) -> list[dict]:
    """Continue the documents' prompts with ``target`` (:func:`continue_greedily`) for up to
    ``minutes`` (0: only read what ``path`` holds). Every BATCH_PROMPTS continuations, their last
    ``seq_len`` fed rows — tokens, the target's features at ``layers`` (default: the final one) and
    greedy tokens: training sequences — become a shard in ``shard_dir``
    (:func:`specdec.train.data.write_shard`), then their ``{"name", "tokens", "prompt_tokens",
    "shard"}`` rows are appended to ``path``; returns every row there. Resumes: prompts with a row are skipped, and a shard whose rows were never written (a run
    cut in between) is dropped. Rows without ``"shard"`` (older runs) have no features yet:
    :func:`generated_sequences` hands them to the teacher-forced extraction."""
    from tqdm import tqdm

    rows = read_generated(path)
    shard_count = 1 + max((row["shard"] for row in rows if "shard" in row), default=-1)
    orphan = shard_path(shard_dir, shard_count)
    if orphan.is_file():
        orphan.unlink()
    if minutes <= 0:
        return rows
    done = {row["name"] for row in rows}
    todo = [(prompt, ids) for prompt, ids in prompt_ids(docs, target.tokenizer.encode, held_out=False, seed=seed)
            if prompt.name not in done]
    if not todo and not rows:
        raise SpecdecError("the training data offers no prompts to generate from (no Python functions with "
                           f"docstrings, no document of {TEXT_PROMPT_TOKENS}+ tokens)")
    if concurrency is None and todo:
        concurrency = auto_concurrency(target.backend, sum(len(ids) for _, ids in todo) / len(todo), new_tokens)
        log(f"generating {concurrency} continuations at once (auto: from this machine's step costs)")
    path.parent.mkdir(parents=True, exist_ok=True)
    start, made = time.perf_counter(), 0
    bar = tqdm(total=len(todo), desc="target continuations", unit="prompt", disable=not progress)
    finished: list[Continuation] = []
    with path.open("a", encoding="utf-8") as sink:
        if path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            sink.write("\n")  # after a torn last line (read_generated dropped it), start a fresh one

        def write(batch: list[Continuation]) -> None:
            nonlocal shard_count
            write_shard(shard_path(shard_dir, shard_count), shard_rows(batch, seq_len), layers or (target.config.num_layers,))
            for c in batch:  # after the shard: a row on file always has its features
                row = {"name": todo[c.index][0].name, "tokens": c.tokens, "prompt_tokens": c.prompt_tokens,
                       "shard": shard_count}
                sink.write(json.dumps(row) + "\n")
                rows.append(row)
            sink.flush()
            shard_count += 1

        for continuation in continue_greedily(target.backend, [ids for _, ids in todo], new_tokens, concurrency or DEFAULT_CONCURRENCY,
                                              target.tokenizer.stop_token_ids, seq_len, layers,
                                              lambda: time.perf_counter() - start < minutes * 60):
            finished.append(continuation)
            made += len(continuation.tokens) - continuation.prompt_tokens
            bar.update(1)
            bar.set_postfix_str(f"{made / (time.perf_counter() - start):.0f} tokens/s")
            if len(finished) == BATCH_PROMPTS:
                write(finished)
                finished = []
        if finished:
            write(finished)
    bar.close()
    seconds = time.perf_counter() - start
    log(f"generated {made} tokens in {seconds / 60:.1f} min ({made / max(seconds, 1e-9):.0f} tokens/s), their "
        f"features kept; {len(rows)} continuations in {path.name}")
    return rows


def shard_rows(batch: list[Continuation], seq_len: int) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Continuations as training sequences (:func:`~specdec.train.data.write_shard`'s rows): each one's
    last ``seq_len`` fed rows — tokens, features and the target's greedy token after each."""
    return [(c.tokens[:-1][-seq_len:], c.features[-seq_len:], c.target_ids[-seq_len:]) for c in batch]


def held_out_continuations(target, prompts: list[list[int]], shard_dir: Path, new_tokens: int,  # noqa: ANN001 - LoadedModel
                           layers: tuple[int, ...] = (), seq_len: int = 256, concurrency: int | None = None,
                           log: Callable[[str], None] = lambda _line: None) -> bool:
    """The held-out curve's data for a run trained on continuations: the target continuing
    ``prompts`` (token ids of held-out prompts, :func:`held_out_prompts`), written as one shard in
    ``shard_dir`` (kept: a resumed run reads it back). Why: a drafter trained on the target's text drafts over the target's
    text, and teacher-forced agreement over human source is another number — the 0.5B draft agreed
    with the target's greedy token 0.81 of the time over held-out stdlib source but 0.88 over the
    target's continuations of held-out prompts, and only the latter is what speculation accepts.
    False (nothing written) when there is no prompt. A shard of another prompt count
    (``--held-out-sequences`` changed) is replaced."""
    from safetensors import safe_open

    path = shard_path(shard_dir, 0)
    if not prompts:
        return False
    if path.is_file():
        with safe_open(str(path), framework="pt") as shard:
            if shard.get_slice("tokens").get_shape()[0] == len(prompts):
                return True
    start = time.perf_counter()
    if concurrency is None:
        concurrency = auto_concurrency(target.backend, sum(map(len, prompts)) / len(prompts), new_tokens)
    finished = sorted(continue_greedily(target.backend, prompts, new_tokens, concurrency, target.tokenizer.stop_token_ids,
                                        seq_len, layers), key=lambda c: c.index)
    write_shard(path, shard_rows(finished, seq_len), layers or (target.config.num_layers,))
    log(f"held out: the target's continuations of {len(prompts)} held-out prompts "
        f"({(time.perf_counter() - start) / 60:.1f} min)")
    return True


def generated_sequences(rows: list[dict], seq_len: int, seed: int = 0) -> list[list[int]]:
    """The rows whose features were not kept when they were generated (runs before features were
    recorded during generation) as training sequences for the teacher-forced extraction: each its
    last ``seq_len`` tokens (the whole continuation and as much of the prompt as fits — the
    continuation is the on-policy part), in a seeded order."""
    sequences = [row["tokens"][-seq_len:] for row in rows
                 if "shard" not in row and len(row["tokens"]) > row["prompt_tokens"]]
    random.Random(seed).shuffle(sequences)
    return sequences
