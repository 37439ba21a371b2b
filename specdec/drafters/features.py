"""What the drafters that read the target's own hidden states (EAGLE, Medusa) share: asking the
target's cache of the request to record its features, the target's LM head rows they score with,
and what one draft pass reads. One class per method still lives in its own file."""

from __future__ import annotations

from typing import Callable

import torch

from specdec.backends.torch_backend import TorchBackend
from specdec.drafters.base import Drafter, DrafterResources
from specdec.drafters.vocab import DraftVocab, usable_vocab_limit
from specdec.errors import SpecdecError
from specdec.models.head_files import trained_head
from specdec.models.heads import DraftHead
from specdec.models.kv_cache import KVCache


class FeatureDrafter(Drafter):
    """Base of :class:`~specdec.drafters.eagle.EagleDrafter` and :class:`~specdec.drafters.medusa.MedusaDrafter`."""

    def __init__(self, head: DraftHead, target: TorchBackend) -> None:
        self.head = head
        self.decoder = target.decoder
        self.vocab_size = target.config.vocab_size
        #: the head's draft vocabulary: the ids it scores with the target's LM head, ``[N]`` (a
        #: frequency-ranked one), or None and ``vocab_limit``: the ids below it (None: all)
        self.draft_ids: torch.Tensor | None = head.draft_ids
        self.vocab_limit = None if self.draft_ids is not None else usable_vocab_limit(head.config.draft_vocab_size,
                                                                                          self.vocab_size)
        #: what the :meth:`scorer`'s rows score: drafting maps them to token ids (draft_steps, grow_tree)
        self.vocab = DraftVocab(self.vocab_size, self.draft_ids)
        self._scorer: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.target_state: KVCache | None = None
        self.model_forwards = 0

    def scorer(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The target's LM head, cut to the draft vocabulary (``Decoder.head_rows``); its row j
        scores token ``draft_ids[j]`` (or j): :attr:`vocab` maps each where it belongs."""
        if self._scorer is None:  # looked up once: a cut by ids is keyed by their bytes (a copy off a GPU)
            if self.draft_ids is not None:
                self._scorer = self.decoder.head_rows(self.draft_ids)
            else:
                self._scorer = self.decoder.head_rows(self.vocab_limit) if self.vocab_limit else self.decoder.lm_head
        return self._scorer

    def head_rows_bytes(self) -> int:
        """Bytes of one pass of :meth:`scorer`."""
        rows = self.scorer()
        if isinstance(rows, torch.nn.Module):
            return sum(t.numel() * t.element_size() for t in [*rows.parameters(), *rows.buffers()])
        # a float head's rows
        scored = len(self.draft_ids) if self.draft_ids is not None else self.vocab_limit or self.vocab_size
        return scored * self.decoder.config.hidden_size * self.decoder.lm_head.weight.element_size()

    def bind_target_state(self, state: object) -> None:
        """Before the prefill: the target's cache keeps every position's hidden states at the layers the head reads."""
        if not isinstance(state, KVCache):
            raise SpecdecError(f"{self.name} reads the target's features: it needs specdec's torch backend")
        state.record_features(self.decoder.config.hidden_size, self.head.config.read_layers)
        self.target_state = state

    def committed_features(self, context_ids: list[int]) -> KVCache:
        """The target's cache, checked to hold every committed token but the newest, with features."""
        state = self.target_state
        if state is None or state.features is None:
            raise RuntimeError(f"{type(self).__name__} needs the target's cache: the engine calls bind_target_state() before prefill")
        if state.seq_len != len(context_ids) - 1:
            raise RuntimeError(f"target cache holds {state.seq_len} positions, expected {len(context_ids) - 1}")
        return state


def head_for(res: DrafterResources, kind: str) -> DraftHead:
    """The trained ``kind`` head a request's factory needs, with clear errors for what is missing."""
    if not isinstance(res.target_backend, TorchBackend):
        raise SpecdecError(f"{kind} reads the target's features: it needs specdec's torch backend")
    if not res.spec.drafter_path:
        raise SpecdecError(f"{kind} needs a trained head: --drafter-path DIR (SpecConfig.drafter_path; train one with `specdec train-drafter --kind {kind}`)")
    return trained_head(res.target_backend.decoder, res.spec.drafter_path, kind)
