"""The frozen parts of the target a head trains through (embedding, final norm, LM head rows)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TargetParts:
    """The frozen parts of the target a head trains through: token embedding, final norm and the
    first ``rows`` LM head rows (``[rows, hidden]``, read back from any weight format), kept in
    ``compute_dtype`` — the training's matmul precision (:mod:`specdec.train.precision`): cast once
    here rather than by autocast at every call (50 M values for 32768 rows)."""

    def __init__(self, decoder: nn.Module, rows: "int | torch.Tensor", compute_dtype: torch.dtype = torch.float32) -> None:
        """``rows``: the first that many LM head rows, or the rows of the token ids ``rows [N]`` (a
        frequency-ranked draft vocabulary: :mod:`specdec.train.vocab`)."""
        self.embed_tokens = decoder.model.embed_tokens
        self.norm_weight = decoder.model.norm.weight.detach().float().clone()
        self.eps = decoder.config.rms_norm_eps
        self.compute_dtype = compute_dtype
        self.lm_rows = float_head_rows(decoder, rows).to(compute_dtype)
        #: the token id of each row (None: row i is id i)
        self.draft_ids = rows.to(self.lm_rows.device) if isinstance(rows, torch.Tensor) else None

    @property
    def device(self) -> torch.device:
        """Where the target runs, and so where a head trains through these parts (CPU or CUDA)."""
        return self.lm_rows.device

    @torch.no_grad()
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens.long()).float()

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's final norm (what its LM head reads)."""
        return F.rms_norm(hidden, self.norm_weight.shape, self.norm_weight, self.eps)

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Pre-norm features ``[T, hidden]`` → float32 logits over the head's rows ``[T, rows]``, or
        over ``weight [S, hidden]``, some of them (``[T, S]``: a sampled token loss's :meth:`cut`)."""
        return self.normed_logits(self.norm(hidden), weight)

    def token_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Row indices of :meth:`logits` (an argmax) → the token ids they score."""
        return rows if self.draft_ids is None else self.draft_ids[rows]

    def normed_logits(self, normed: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Normed hidden states ``[T, hidden]`` → float32 logits ``[T, rows]`` (or ``[T, S]`` over a
        :meth:`cut` ``weight``; softmax and losses stay float32 whatever the matmul ran in)."""
        return F.linear(normed.to(self.compute_dtype), self.lm_rows if weight is None else weight).float()

    def cut(self, rows: torch.Tensor) -> torch.Tensor:
        """The LM head rows of the row indices ``rows [S]``, ``[S, hidden]``: gathered once per sequence
        for a sampled token loss, not at every unrolled step or head (1.5–2 ms for 3000 rows on a Zen 4)."""
        return self.lm_rows[rows]


@torch.no_grad()
def float_head_rows(decoder: nn.Module, rows: "int | torch.Tensor") -> torch.Tensor:
    """The LM head's first ``rows`` rows, or those of the ids ``rows [N]``, as float32 ``[N, hidden]``:
    sliced from a float head, or the quantized head's own output for the identity matrix
    (weight-only kernels: exactly its dequantized weights; int8 activations: a one-hot row
    quantizes without error)."""
    head = decoder.lm_head
    if isinstance(head, nn.Linear):
        picked = head.weight[:rows] if isinstance(rows, int) else head.weight[rows.to(head.weight.device)]
        return picked.detach().float().clone()
    hidden = decoder.config.hidden_size
    return decoder.head_rows(rows)(torch.eye(hidden)).float().T.contiguous()


@torch.no_grad()
def float_linear(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A projection's weight ``[out, in]`` and bias as float32: a float ``nn.Linear`` as is, an
    int8 one dequantized (its per-channel scales times its int8 weights)."""
    from specdec.errors import SpecdecError
    from specdec.kernels.int8 import Int8Linear

    if isinstance(module, nn.Linear):
        weight, bias = module.weight, module.bias
    elif isinstance(module, Int8Linear):
        weight, bias = module.qweight.float() * module.scales[:, None], module.bias
    else:
        raise SpecdecError(f"--head-init target reads the target's last layer in float or int8, not {type(module).__name__}: "
                           "train with --quantize int8 or none")
    return weight.detach().float().clone(), None if bias is None else bias.detach().float().clone()


@torch.no_grad()
def last_layer_weights(decoder: nn.Module, intermediate_size: int) -> dict[str, torch.Tensor]:
    """The target's last decoder layer as a state dict for an EAGLE head's layer
    (:meth:`specdec.models.heads.EagleHead.init_from_layer`): attention and norms as they are, the
    MLP cut to its ``intermediate_size`` most important neurons (‖up row‖ · ‖down column‖: a SwiGLU
    neuron's output is its down column times its gated up projection) when the head's is narrower.
    Why start there: the head maps a feature near the target's last residual stream to the next one,
    the very job of the target's last layer; a random layer spends its first training steps
    learning projections this one already has."""
    layer = decoder.model.layers[-1]
    state: dict[str, torch.Tensor] = {
        "input_layernorm.weight": layer.input_layernorm.weight.detach().float().clone(),
        "post_attention_layernorm.weight": layer.post_attention_layernorm.weight.detach().float().clone(),
    }
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        weight, bias = float_linear(getattr(layer.self_attn, name))
        state[f"self_attn.{name}.weight"] = weight
        if bias is not None:
            state[f"self_attn.{name}.bias"] = bias
    gate, _ = float_linear(layer.mlp.gate_proj)
    up, _ = float_linear(layer.mlp.up_proj)
    down, _ = float_linear(layer.mlp.down_proj)
    keep = torch.topk(up.norm(dim=1) * down.norm(dim=0), min(intermediate_size, up.shape[0])).indices.sort().values
    state.update({"mlp.gate_proj.weight": gate[keep], "mlp.up_proj.weight": up[keep], "mlp.down_proj.weight": down[:, keep]})
    return state
