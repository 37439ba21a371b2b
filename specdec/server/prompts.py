"""A request's prompts as the server runs them: the chat template or the completion prompts, each checked
against the context window and the server's limits, times ``n`` choices (OpenAI's order: by prompt, then n),
with the text ``echo`` puts before a completion. Runs off the event loop (tokenizing a long prompt takes a while)."""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec.api import encode_prompt
from specdec.engine import check_context
from specdec.errors import ContextLengthError, SpecdecError
from specdec.sampling import SamplingParams
from specdec.server.jobs import choice_params, completion_prompts
from specdec.server.params import APIError, sampling_params
from specdec.server.schemas import ChatCompletionRequest, CompletionRequest, joined_text
from specdec.server.state import ServerState
from specdec.server.tools import RequestTools, chat_prompt, forced_call


def request_choices(state: ServerState, req: CompletionRequest | ChatCompletionRequest, chat: bool,
                    ) -> tuple[list[tuple[list[int], SamplingParams, str | None]], RequestTools | None, SamplingParams]:
    """The request's choices (prompt ids, sampling parameters, echo text; OpenAI's order: by prompt, then n),
    its tools and the last prompt's sampling parameters, or the 400 that says what is wrong."""
    calls = None  # the tools outputs are parsed for (server/tools.py); None: no tools
    forced = None  # tool_choice "required" / a named function: the output's constraint
    if chat:
        prompt, calls = chat_prompt(state.target.tokenizer, req)
        prompts, forced = [prompt], forced_call(req)
    else:
        if req.suffix is not None and req.echo:
            raise APIError(400, "echo cannot be combined with suffix", param="suffix")
        prompts = completion_prompts(req.prompt, req.suffix, state.target.tokenizer)
    choices = []
    for prompt in prompts:
        prompt_ids, params = checked_prompt(state, req, prompt)
        if forced is not None:
            params = dataclasses.replace(params, structured=forced)
        echo = (echo_text(state, prompt, prompt_ids) if not chat else continued_text(req)) if req.echo else None
        choices += [(prompt_ids, choice_params(params, i), echo) for i in range(req.n)]
    return choices, calls, params


def checked_prompt(state: ServerState, req: CompletionRequest | ChatCompletionRequest, prompt: Any) -> tuple[list[int], SamplingParams]:
    """One prompt's token ids and sampling parameters (its length sets the default max_tokens), or
    the 400 that says what is wrong with it."""
    where = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"  # the field that holds the prompt
    try:
        prompt_ids = encode_prompt(state.target, prompt, chat=False)
    except SpecdecError as exc:
        raise APIError(400, str(exc), param=where) from None
    if state.max_prompt_tokens is not None and len(prompt_ids) > state.max_prompt_tokens:
        raise APIError(400, f"the prompt has {len(prompt_ids)} tokens; this server's limit is {state.max_prompt_tokens} "
                            "(--max-prompt-tokens)", param=where, code="context_length_exceeded")
    context_len = state.target.config.max_position_embeddings
    if len(prompt_ids) >= context_len:  # said as such: "+ max_tokens (1)" named a field the client never sent
        raise APIError(400, f"the prompt has {len(prompt_ids)} tokens and the model's context window holds {context_len}: "
                            "no room for a completion; shorten the prompt", param=where, code="context_length_exceeded")
    params = sampling_params(req, context_len, len(prompt_ids), state.max_tokens_limit, state.chat_default_max_tokens)
    try:
        check_context(len(prompt_ids), params.max_tokens, context_len)
    except ContextLengthError as exc:
        raise APIError(400, str(exc), param=where, code="context_length_exceeded") from None
    except SpecdecError as exc:  # an empty prompt
        raise APIError(400, str(exc), param=where) from None
    return prompt_ids, params


def continued_text(req: ChatCompletionRequest) -> str | None:
    """A chat request's ``echo`` (vLLM's rule): the last message's text where its role is the answer's — any role when
    the prompt ends without a new turn's header (add_generation_prompt false: the answer continues it), an assistant
    message otherwise; else nothing."""
    last = req.messages[-1]
    if last.content is None or (req.add_generation_prompt and last.role != "assistant"):
        return None
    return joined_text(last.content)


def echo_text(state: ServerState, prompt: str | list[int], prompt_ids: list[int]) -> str:
    """What ``echo`` puts before the output: the prompt as sent, or its token ids' text."""
    return prompt if isinstance(prompt, str) else state.target.tokenizer.decode(prompt_ids)
