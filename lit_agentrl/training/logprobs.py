"""Token log-probs of a causal LM within a memory budget: the output head runs only where the loss looks, in chunks.

The plain way (``model(...).logits`` then :func:`~lit_agentrl.training.losses.token_logprobs`) materialises
full-vocabulary logits for every position, prompt included, upcasts them to fp32, and keeps them (and the
entropy's temporaries) for backward: at 16,384 tokens and a 151k vocabulary that is tens of GB. Here the model's
output head is swapped, for one forward call, for one that takes the hidden states at the trained positions only
and projects them ``chunk_tokens`` at a time; each chunk's logits live only inside an activation checkpoint, so
backward recomputes them one chunk at a time. Memory: one chunk's [chunk, vocab] temporaries instead of
[tokens, vocab]; compute: the head's matmul once more in backward, over trained tokens only.

The swap happens inside the model's own forward, so FSDP2 has gathered the head's weight (a root parameter) and
its backward hooks see the result, exactly as with the full logits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from lit_agentrl.training.losses import TokenLogProbs, token_logprobs


def model_token_logprobs(
    model: PreTrainedModel,
    inputs: dict[str, Any],
    targets: torch.Tensor,
    positions: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = True,
    entropy_grad: bool = False,
) -> TokenLogProbs:
    """Log-prob of ``targets`` [R, W] under ``model(**inputs)`` at ``positions`` ([R, W] bool), and the entropy.

    Both are [R, W] float32, zero outside ``positions``; the entropy is None without ``with_entropy`` and carries
    a graph only with ``entropy_grad``. ``chunk_tokens=0`` computes the full logits instead (the plain path).
    """
    if chunk_tokens <= 0:
        logits = model(**inputs).logits
        out = token_logprobs(logits, targets, temperature, with_entropy, entropy_grad)
        keep = positions.to(out.logprobs.dtype)
        return TokenLogProbs(out.logprobs * keep, out.entropy * keep if out.entropy is not None else None)
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(
            f"{type(model).__name__}'s output head is a {type(head).__name__}, not a Linear: set "
            "model.logprob_chunk_tokens: 0 to compute full logits"
        )
    selected = targets[positions]

    def project(hidden: torch.Tensor) -> torch.Tensor:  # [R, W, H] -> [R, W, 2]: log-prob and entropy per token
        values = chunked_logprobs(
            hidden[positions], head.weight, head.bias, selected, temperature, chunk_tokens, with_entropy, entropy_grad
        )
        out = values.new_zeros((*positions.shape, 2))
        out[positions] = values
        return out

    with _head_replaced(head, project):
        both = model(**inputs).logits
    return TokenLogProbs(both[..., 0], both[..., 1] if with_entropy else None)


def model_hidden_states(model: PreTrainedModel, inputs: dict[str, Any], positions: torch.Tensor) -> torch.Tensor:
    """The final hidden states (what the output head reads) of ``model(**inputs)`` at ``positions`` ([R, W] bool):
    [N, H] in row-major order. The head is skipped, so no logits are computed."""
    head = model.get_output_embeddings()
    captured: list[torch.Tensor] = []

    def keep(hidden: torch.Tensor) -> torch.Tensor:
        captured.append(hidden[positions])
        return hidden.new_zeros((*positions.shape, 1))

    with _head_replaced(head, keep):
        model(**inputs)
    return captured[0]


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool,
    entropy_grad: bool,
) -> torch.Tensor:
    """[N, 2] (log-prob of each of ``targets`` [N], entropy) from ``hidden`` [N, H] through the head ``weight`` [V, H].

    Under autograd each chunk is an activation checkpoint: only its input is kept, and backward recomputes its
    logits, so no more than one chunk's [chunk, V] tensors exist at once.
    """
    parts = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        args = (hidden[start : start + chunk_tokens], weight, bias, targets[start : start + chunk_tokens])
        options = (temperature, with_entropy, entropy_grad)
        if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
            parts.append(checkpoint(_chunk, *args, *options, use_reentrant=False))
        else:
            parts.append(_chunk(*args, *options))
    if not parts:
        return hidden.new_zeros((0, 2), dtype=torch.float32)
    return torch.cat(parts)


def _chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)
    out = token_logprobs(logits.unsqueeze(0), targets.unsqueeze(0), temperature, with_entropy, entropy_grad)
    entropy = out.entropy if out.entropy is not None else torch.zeros_like(out.logprobs)
    return torch.stack([out.logprobs[0], entropy[0]], dim=-1)


@contextmanager
def _head_replaced(head: torch.nn.Module, forward: Any) -> Iterator[None]:
    """``head(x)`` calls ``forward(x)`` inside the block (an instance attribute shadows the class's method)."""
    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest elementwise difference over the largest magnitude of ``b``: what the load-time checks compare,
    since it is the compute dtype's rounding that differs between two ways of computing the same values."""
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-6))


def check_chunked_head(model: PreTrainedModel, chunk_tokens: int, tolerance: float = 1e-3) -> None:
    """Raise ``ValueError`` unless the chunked path gives the model's own log-probs.

    The chunked head assumes the logits are ``head(hidden)``, unchanged afterwards; a model that scales or caps
    them after its head (Gemma's soft-capping, Cohere's logit scale) would train on wrong log-probs. ``tolerance``
    is relative to the largest log-prob's magnitude (the compute dtype's rounding differs between the two paths).
    """
    if chunk_tokens <= 0:
        return
    device = next(model.parameters()).device
    if device.type == "meta":  # weights not materialised yet: nothing to run
        return
    ids = torch.tensor([[3, 5, 7, 9, 11, 4]], device=device)
    targets = torch.tensor([[5, 7, 9, 11, 4, 6]], device=device)
    positions = torch.tensor([[False, True, True, False, True, True]], device=device)
    inputs = {"input_ids": ids, "use_cache": False}
    with torch.no_grad():
        plain = model_token_logprobs(model, inputs, targets, positions, chunk_tokens=0)
        chunked = model_token_logprobs(model, inputs, targets, positions, chunk_tokens=2)
    if relative_difference(chunked.logprobs, plain.logprobs) > tolerance:
        raise ValueError(
            f"{type(model).__name__} changes its logits after the output head, so chunked log-probs would be wrong: "
            "set model.logprob_chunk_tokens: 0"
        )
