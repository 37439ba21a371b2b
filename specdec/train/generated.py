"""Self-distillation data: the target's own continuations of prompts drawn from the training text.

Teacher forcing over library source (:mod:`specdec.train.data`) teaches a head what the target
predicts over *human* text; when speculating, the head drafts over the *target's* text, answering a
prompt — and a head trained on the stdlib reached top-1 0.42 on held-out stdlib but α 0.12 on
HumanEval (benchmarks/results/2026-11-26/session-23). EAGLE, Medusa-2 and DistillSpec all train on
target-generated data for that reason. Here the prompts come from the same documents: for Python
source, every function with a docstring as its module's imports plus the signature and docstring
(the shape of a code-completion request); for other text, each document's opening. The target
continues each greedily, many at a time (:func:`specdec.batch.generate_batch`, continuous batching:
~4× one request's rate on a CPU), and prompt + continuation, as token ids, become training
sequences. Rows are appended to ``generated.jsonl`` as they finish, so a cut run resumes where it
stopped. Only training documents' prompts are continued; the held-out documents' prompts are where
the training report speculates (:func:`held_out_prompts`), so α is measured on requests of the same
shape the head learnt from, drawn from text it never saw.
"""

from __future__ import annotations

import ast
import json
import random
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specdec.errors import SpecdecError
from specdec.train.data import Document

#: tokens of a non-Python document's opening used as its prompt
TEXT_PROMPT_TOKENS = 64
#: a prompt longer than this is skipped (a long docstring leaves little to learn per token spent)
MAX_PROMPT_TOKENS = 384
#: prompts generated per batch (results are appended to the file after each)
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


def generate_sequences(target, docs: list[Document], path: Path, minutes: float, new_tokens: int,  # noqa: ANN001 - LoadedModel
                       concurrency: int = 8, seed: int = 0, progress: bool = False,
                       log: Callable[[str], None] = lambda _line: None) -> list[dict]:
    """Continue the documents' prompts with ``target`` (greedy, ``new_tokens`` each, ``concurrency``
    in flight) for up to ``minutes`` (0: only read what ``path`` holds), appending
    ``{"name", "tokens", "prompt_tokens"}`` rows to ``path``; returns every row there."""
    from tqdm import tqdm

    from specdec.batch import generate_batch
    from specdec.sampling import SamplingParams

    rows = read_generated(path)
    if minutes <= 0:
        return rows
    done = {row["name"] for row in rows}
    encode = target.tokenizer.encode
    todo = []
    for prompt, ids in prompt_ids(docs, encode, held_out=False, seed=seed):
        if prompt.name not in done:
            todo.append((prompt, ids))
    if not todo and not rows:
        raise SpecdecError("the training data offers no prompts to generate from (no Python functions with "
                           f"docstrings, no document of {TEXT_PROMPT_TOKENS}+ tokens)")
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    start, made = time.perf_counter(), 0
    bar = tqdm(total=len(todo), desc="target continuations", unit="prompt", disable=not progress)
    with path.open("a", encoding="utf-8") as sink:
        if path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            sink.write("\n")  # after a torn last line (read_generated dropped it), start a fresh one
        for begin in range(0, len(todo), BATCH_PROMPTS):
            if time.perf_counter() - start > minutes * 60:
                break
            batch = todo[begin : begin + BATCH_PROMPTS]
            results = generate_batch(target, [ids for _, ids in batch], params, max_num_seqs=concurrency)
            for (prompt, ids), result in zip(batch, results):
                row = {"name": prompt.name, "tokens": ids + result.token_ids, "prompt_tokens": len(ids)}
                sink.write(json.dumps(row) + "\n")
                rows.append(row)
                made += len(result.token_ids)
            sink.flush()
            bar.update(len(batch))
    bar.close()
    seconds = time.perf_counter() - start
    log(f"generated {made} tokens in {seconds / 60:.1f} min ({made / max(seconds, 1e-9):.0f} tokens/s); "
        f"{len(rows)} continuations in {path.name}")
    return rows


def generated_sequences(rows: list[dict], seq_len: int, seed: int = 0) -> list[list[int]]:
    """One training sequence per row: its last ``seq_len`` tokens (the whole continuation and as
    much of the prompt as fits — the continuation is the on-policy part), in a seeded order."""
    sequences = [row["tokens"][-seq_len:] for row in rows if len(row["tokens"]) > row["prompt_tokens"]]
    random.Random(seed).shuffle(sequences)
    return sequences
