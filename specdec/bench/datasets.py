"""Prompt sets for benchmarks and `specdec verify`: Spec-Bench (incl. MT-Bench), HumanEval, GSM8K.

Read from ``../shared/data`` beside the project by default (``SPECDEC_DATA_DIR`` or ``--data-dir``
to override); a user's own JSONL with a ``prompt`` or ``turns`` field works too. Errors name the
file and line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.tokenizer import CHAT_ROLES, text_content

log = logging.getLogger(__name__)

#: what a prompt row of a JSONL/JSON file may hold (a logged request's body is read by its own rules)
PROMPT_ROW_FIELDS = frozenset({"prompt", "turns", "id", "category", "chat"})

DATASET_FILES = {
    "humaneval": "humaneval/humaneval_0_99.jsonl",
    "spec_bench": "spec_bench/question.jsonl",
    "gsm8k": "gsm8k/test_0_399.jsonl",
}
#: Spec-Bench task groups (question_id ranges from the upstream README).
SPEC_BENCH_GROUPS = {
    "mt_bench": range(81, 161),
    "translation": range(161, 241),
    "summarization": range(241, 321),
    "qa": range(321, 401),
    "math_reasoning": range(401, 481),
    "rag": range(481, 561),
}


@dataclass
class PromptRow:
    id: str
    category: str
    turns: list[str]
    chat: bool = True  # render with the chat template (HumanEval is a raw completion prompt)
    meta: dict = field(default_factory=dict)
    #: messages before the first turn (a logged request's system prompt and earlier exchanges; chat rows only)
    history: list[dict] = field(default_factory=list)

    def first_prompt(self) -> str | list[dict]:
        """The first turn as :func:`specdec.api.encode_prompt` takes it: its text, or with a history, the messages."""
        return [*self.history, {"role": "user", "content": self.turns[0]}] if self.history else self.turns[0]


#: ShareGPT's speaker names as chat roles
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def chat_messages(row: dict, where: str) -> list[dict] | None:
    """A logged conversation's messages — an OpenAI chat request's ``messages`` or a ShareGPT row's ``conversations``
    — as ``{"role", "content"}`` dicts with text content, each checked here (a mistyped role failed after the models
    loaded, naming neither file nor line). None: the row has neither field. Tool-calling turns (``tool_calls``,
    ``tool`` messages) are refused by name: the request's ``tools`` would have to be rendered as the server does."""
    if isinstance(row.get("messages"), list):
        messages, shape = row["messages"], "message {index} needs a 'role' and a text 'content'"
    elif isinstance(row.get("conversations"), list):
        messages, shape = [], "conversations[{index}] needs 'from' (one of " + ", ".join(SHAREGPT_ROLES) + ") and a text 'value'"
        for turn in row["conversations"]:
            known = isinstance(turn, dict) and turn.get("from") in SHAREGPT_ROLES
            messages.append({"role": SHAREGPT_ROLES[turn["from"]], "content": turn.get("value")} if known else None)
    else:
        return None
    shaped = []
    for index, message in enumerate(messages):
        if isinstance(message, dict) and (message.get("tool_calls") or message.get("role") == "tool"):
            raise SpecdecError(f"{where}: message {index} is a tool-calling turn; conversations with tool calls are not "
                               "read as prompts yet (measure them through the server)")
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # OpenAI's content parts: text only (the server refuses images too)
            try:
                content = text_content(content, index)
            except SpecdecError as exc:
                raise SpecdecError(f"{where}: {exc}") from None
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(content, str):
            raise SpecdecError(f"{where}: " + shape.format(index=index))
        if message["role"] not in CHAT_ROLES:
            raise SpecdecError(f"{where}: message {index}'s role {message['role']!r} is not one of {', '.join(CHAT_ROLES)}")
        shaped.append({"role": message["role"], "content": content})
    return shaped


def logged_conversation(row: dict, where: str) -> tuple[list[dict], str] | None:
    """A row of a user's own traffic (:func:`chat_messages`) as (the messages before its last user message, that
    message's text): the prompt that request asked for. A logged answer after it is dropped (what is measured is
    answering it). None: not a logged conversation."""
    shaped = chat_messages(row, where)
    if shaped is None:
        return None
    while shaped and shaped[-1]["role"] == "assistant":
        shaped.pop()
    if not shaped or shaped[-1]["role"] != "user" or not shaped[-1]["content"].strip():
        raise SpecdecError(f"{where}: the conversation must end with a non-empty user message (a logged answer after it is dropped)")
    return shaped[:-1], shaped[-1]["content"]


def default_data_dir() -> Path:
    env = os.environ.get("SPECDEC_DATA_DIR")
    if env:
        return Path(env)
    candidates = [Path(__file__).resolve().parents[2].parent / "shared" / "data", Path.cwd().parent / "shared" / "data", Path.cwd() / "shared" / "data"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return candidates[0]


#: file endings read as rows of JSON objects (a .json file: one array of them, as ShareGPT-style sets ship)
ROW_FILE_SUFFIXES = (".jsonl", ".json")


def read_jsonl(path: Path, text_files_read: bool = False) -> list[dict]:
    """Rows of a JSONL file, each with its line number under ``_line``; errors name file and line. A
    ``.json`` file holding one array of objects is read as its rows (``_line``: the row's number).
    ``text_files_read``: the caller also reads ``.txt`` files as raw text (a training corpus), so a .json file that
    is not rows is pointed there."""
    if path.is_dir():
        raise SpecdecError(f"dataset {path}: is a folder; give a JSONL file or a dataset name (humaneval, gsm8k, spec_bench)")
    if not path.is_file():
        raise SpecdecError(f"dataset file not found: {path}")
    if path.suffix == ".json":
        return _json_array_rows(path, text_files_read)
    rows = []
    with path.open("rb") as handle:  # lines decoded one by one: a binary file's error names its line, no traceback
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise SpecdecError(f"{path}:{number}: not UTF-8 text (a JSONL file is UTF-8 JSON, one object a line)") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecdecError(f"{path}:{number}: malformed JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise SpecdecError(f"{path}:{number}: expected a JSON object")
            rows.append(row | {"_line": number})
    return rows


def _json_array_rows(path: Path, text_files_read: bool = False) -> list[dict]:
    """A .json file's array of objects (it was read as one raw-text document, brackets and keys included)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpecdecError(f"{path}: malformed JSON at line {exc.lineno} ({exc.msg})") from None
    except UnicodeDecodeError:
        raise SpecdecError(f"{path}: not UTF-8 text") from None
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise SpecdecError(f"{path}: a .json file must hold one array of objects (one row each, as a .jsonl file's lines)"
                           + ("; give other text as .txt" if text_files_read else ""))
    return [row | {"_line": number} for number, row in enumerate(data, start=1)]


def dataset_path(name: str) -> Path:
    """A dataset name (``humaneval``, ``gsm8k``, ``spec_bench``: its file in the data folder) or a path."""
    return default_data_dir() / DATASET_FILES[name] if name in DATASET_FILES else Path(name).expanduser()


#: the JSONL fields :func:`document_text` reads, for error messages and --help
DOCUMENT_FIELDS = ("'text', 'prompt' (+ 'completion' or 'canonical_solution'), 'question' (+ 'answer'), 'turns', "
                   "'conversations' (ShareGPT) or 'messages'")


def document_text(row: dict) -> str | None:
    """One JSONL row as a document to train on or draft from (train-drafter --data, datastore --input): its
    'text'; a prompt with its answer (a completion, HumanEval's canonical solution, GSM8K's question and
    answer); or a conversation's turns. None when the row has none of these."""
    if isinstance(row.get("text"), str) and row["text"]:
        return row["text"]
    for question, answers in (("prompt", ("completion", "canonical_solution")), ("question", ("answer",))):
        if isinstance(row.get(question), str) and row[question]:
            return row[question] + "".join(str(row[a]) for a in answers if isinstance(row.get(a), str))
    turns = row.get("turns")
    if isinstance(turns, list) and turns:
        return "\n".join(map(str, turns))
    for field, key in (("conversations", "value"), ("messages", "content")):  # ShareGPT's and OpenAI's shapes
        parts = row.get(field)
        if isinstance(parts, list) and parts:
            texts = [part.get(key) for part in parts if isinstance(part, dict)]
            if any(isinstance(text, str) and text for text in texts):
                return "\n".join(text for text in texts if isinstance(text, str) and text)
    return None


def _spec_bench_group(question_id: int) -> str:
    for group, ids in SPEC_BENCH_GROUPS.items():
        if question_id in ids:
            return group
    return "other"


def load_prompts(
    dataset: str,
    categories: list[str] | None = None,
    limit: int | None = None,
    data_dir: Path | None = None,
) -> list[PromptRow]:
    """Rows of a named dataset (``humaneval``, ``spec_bench``, ``gsm8k``) or of a JSONL file.

    ``categories`` filters Spec-Bench by task group (``summarization``, ``rag``, ``mt_bench`` …) or by
    MT-Bench category (``coding``, ``writing`` …; such rows are labelled by it). ``limit`` keeps the first N rows *per category*
    so a small run still covers every group.
    """
    path = data_dir / DATASET_FILES[dataset] if data_dir is not None and dataset in DATASET_FILES else dataset_path(dataset)
    if dataset in DATASET_FILES and not path.is_file():  # a clone elsewhere than beside ../shared: say how to point at it
        raise SpecdecError(f"dataset {dataset}: {path} not found; give the folder that holds the datasets with --data-dir "
                           "or $SPECDEC_DATA_DIR (default: ../shared/data beside the project, or shared/data here)")
    raw = read_jsonl(path)
    rows: list[PromptRow] = []
    unread: dict[str, int] = {}  # a prompt row's field nobody reads → the first line it is on
    for row in raw:
        line = row.pop("_line")
        if dataset == "humaneval":
            rows.append(PromptRow(row["task_id"], "humaneval", [row["prompt"]], chat=False, meta=row))
        elif dataset == "gsm8k":
            rows.append(PromptRow(f"gsm8k/{line}", "gsm8k", [row["question"]], meta=row))
        elif dataset == "spec_bench":
            qid = int(row["question_id"])
            rows.append(PromptRow(str(qid), _spec_bench_group(qid), list(row["turns"]), meta={"category": row.get("category")}))
        else:
            conversation = logged_conversation(row, f"{path}:{line}")
            if conversation is not None:
                history, last = conversation
                temperature = row.get("temperature", 1.0 if "model" in row else None)  # a request body: OpenAI's default
                sampled = {"temperature": temperature} if isinstance(temperature, (int, float)) else {}
                rows.append(PromptRow(str(row.get("id", line)), str(row.get("category", "default")), [last], history=history,
                                      meta=sampled))
                continue
            if isinstance(row.get("turns"), list) and row["turns"]:
                turns = [str(t) for t in row["turns"]]
            elif isinstance(row.get("prompt"), str):
                turns = [row["prompt"]]
            else:
                raise SpecdecError(f"{path}:{line}: needs a 'prompt' string, a non-empty 'turns' list, or a logged conversation "
                                   "('messages' as in an OpenAI chat request, or ShareGPT's 'conversations')")
            if not all(turn.strip() for turn in turns):  # generate and the server refuse an empty prompt: so here
                raise SpecdecError(f"{path}:{line}: an empty prompt")
            chat = True if row.get("chat") is None else row["chat"]  # null: unset
            if not isinstance(chat, bool):  # "false" (a string) was true: a raw completion prompt went through the template
                raise SpecdecError(f"{path}:{line}: 'chat' must be true or false, got {chat!r}")
            for key in row.keys() - PROMPT_ROW_FIELDS:
                unread.setdefault(key, line)
            rows.append(PromptRow(str(row.get("id", line)), str(row.get("category", "default")), turns, chat=chat))
    if unread:  # a misspelt "chta"/"categroy" measured other prompts than the user's traffic, without a word
        log.warning("%s: fields not read: %s (a prompt row reads %s)", path,
                    ", ".join(f"{key!r} (line {line})" for key, line in sorted(unread.items(), key=lambda item: item[1])),
                    ", ".join(sorted(PROMPT_ROW_FIELDS)))
    if categories:
        known = {r.category for r in rows} | {r.meta.get("category") for r in rows}
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise SpecdecError(f"unknown categories {unknown} in {path.name}; available: {sorted(k for k in known if k)}")
        # a row picked by its MT-Bench category ("writing") is reported under it, not its group ("mt_bench")
        rows = [r if r.category in categories else dataclasses.replace(r, category=r.meta["category"])
                for r in rows if r.category in categories or r.meta.get("category") in categories]
    if limit is not None:
        per_category: dict[str, int] = {}
        kept = []
        for r in rows:
            if per_category.get(r.category, 0) < limit:
                per_category[r.category] = per_category.get(r.category, 0) + 1
                kept.append(r)
        rows = kept
    return rows


def sampled_rows(rows: list[PromptRow]) -> int:
    """How many logged requests sampled (their body's temperature, OpenAI's default 1.0 where a request left it
    out): a greedy measurement of them overstates acceptance, which the commands that run greedy say."""
    return sum(1 for row in rows if (row.meta.get("temperature") or 0) > 0)
