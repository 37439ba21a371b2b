"""Peers measured in the same run: transformers ``generate()`` plain, with ``assistant_model=``
(assisted generation), and with ``prompt_lookup_num_tokens=``, on the same GGUF weights."""

from __future__ import annotations

from typing import Callable

import torch

from specdec.api import LoadedModel
from specdec.sampling import SamplingParams


def _load_hf(model: LoadedModel, dtype: torch.dtype):  # noqa: ANN202
    from transformers import AutoModelForCausalLM

    path = model.path
    if path.is_dir():
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()


def hf_peers(target: LoadedModel, draft: LoadedModel | None, params: SamplingParams, num_tokens: int = 4,
             dtype: torch.dtype = torch.float32) -> dict[str, Callable[[list[int]], tuple[list[int], dict, str]]]:
    """Runners named ``hf``, ``hf-assisted`` (needs a draft) and ``hf-pld``."""
    hf_target = _load_hf(target, dtype)
    hf_draft = _load_hf(draft, dtype) if draft is not None else None
    stop_ids = sorted(target.tokenizer.stop_token_ids)

    def make(extra: dict) -> Callable[[list[int]], tuple[list[int], dict, str]]:
        def generate_one(ids: list[int]) -> tuple[list[int], dict, str]:
            kwargs = dict(max_new_tokens=params.max_tokens, pad_token_id=target.tokenizer.pad_token_id or 0,
                          eos_token_id=None if params.ignore_eos else stop_ids, do_sample=not params.is_greedy, **extra)
            if not params.is_greedy:
                kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None)
            with torch.inference_mode():
                out = hf_target.generate(torch.tensor([ids]), **kwargs)
            tokens = [t for t in out[0, len(ids):].tolist() if t not in stop_ids or params.ignore_eos]
            return tokens, {"generated_tokens": len(tokens)}, target.tokenizer.decode(tokens)

        return generate_one

    peers = {"hf": make({}), "hf-pld": make({"prompt_lookup_num_tokens": num_tokens})}
    if hf_draft is not None:
        peers["hf-assisted"] = make({"assistant_model": hf_draft})
    return peers
