"""Sampling tokens from a causal LM: the one sampling rule of dprc, and a batched generator.

:func:`sample_token` is how every dprc generator picks the next token — the completions engine
(``inference/engine.py``) and the synthetic-data generator alike: softmax of the logits over
the temperature, nucleus (``top_p``) truncation, one draw from the row's own
``torch.Generator``; temperature 0 is greedy.

:func:`generate` decodes a batch of prompts together over one key/value cache, left padded
(row ``r``'s real tokens are the last ``lengths[r]`` columns, its attention mask zero before
them and its positions counted from its own first token), each row with its own generator
seeded by the caller, until every row has produced an end-of-sequence token or
``max_new_tokens``. A finished row keeps its place (it is fed padding, never read), so the
batch's shapes, and with them the numbers, depend only on the batch's prompts: the same prompts
and seeds give the same tokens on the same machine, which makes a resumed synthetic-data job
exact (:mod:`dprc_core.synthetic.generate`).

Why not ``model.generate``: it draws from the process-wide torch generator, so a row's tokens
would depend on what else the process draws (the embedded worker shares its process with the
API); here every row's randomness is its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

SEED_MOD = 2**63


@dataclass(frozen=True)
class SamplingSettings:
    """How tokens are drawn: ``temperature`` in [0, 2] (0: greedy), ``top_p`` in (0, 1],
    ``max_new_tokens`` ≥ 1 (the answer's length cap)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature <= 2):
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, int)
            or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")


def sample_token(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> int:
    """The next token from one row's ``logits`` [V]: greedy at temperature 0, else a draw from
    softmax(logits / temperature) truncated to the smallest set of tokens whose probability
    reaches ``top_p`` (the token that crosses it included)."""
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < top_p
        pick = torch.multinomial(sorted_probs * keep, 1, generator=generator)
        return int(order[pick])
    return int(torch.multinomial(probs, 1, generator=generator))


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The tokens that end a sequence: the tokenizer's end token and the model's generation
    config's (one id or a list)."""
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for source in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(i for i in source if isinstance(i, int))
    return frozenset(ids)


def _cache_argument(model: Any) -> tuple[str, bool]:
    forward = model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward
    params = inspect.signature(forward).parameters
    # transformers 5.x renames ``past_key_values`` to ``cache``
    return ("cache" if "cache" in params else "past_key_values"), "logits_to_keep" in params


@torch.no_grad()
def generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    settings: SamplingSettings,
    stop_ids: frozenset[int],
    pad_id: int = 0,
) -> list[list[int]]:
    """The generated tokens of each prompt (without the prompt, without the end token), row
    ``r`` drawn with a generator seeded by ``seeds[r]``; a row ends at one of ``stop_ids`` or
    after ``settings.max_new_tokens`` tokens. ``model`` in eval mode; prompts non-empty."""
    from transformers import DynamicCache

    if len(prompts) != len(seeds):
        raise ValueError("one seed per prompt")
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt must hold at least one token")
    cache_arg, keep_arg = _cache_argument(model)
    device = next(model.parameters()).device
    rows = len(prompts)
    longest = max(len(p) for p in prompts)
    ids = torch.full((rows, longest), pad_id, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, longest - len(p) :] = torch.tensor(list(p), dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompts])
    generators = [torch.Generator().manual_seed(int(s) % SEED_MOD) for s in seeds]
    cache: Any = DynamicCache()
    out: list[list[int]] = [[] for _ in range(rows)]
    done = [False] * rows
    width = 0
    step_ids = ids
    for _ in range(settings.max_new_tokens):
        total = width + step_ids.shape[1]
        columns = torch.arange(total)
        mask = (columns[None, :] >= (total - lengths)[:, None]).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, width:]
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if keep_arg else {}
        kwargs[cache_arg] = cache
        logits = model(
            input_ids=step_ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            use_cache=True,
            **kwargs,
        ).logits[:, -1, :]
        logits = logits.float().cpu()
        width = total
        nxt: list[int] = []
        for r in range(rows):
            if done[r]:
                nxt.append(pad_id)
                continue
            token = sample_token(logits[r], settings.temperature, settings.top_p, generators[r])
            if token in stop_ids:
                done[r] = True
            else:
                out[r].append(token)
            nxt.append(token)
        if all(done):
            break
        # a finished row goes on with padding as if it were tokens: what it computes is never
        # read, and the other rows' columns are their own
        lengths = lengths + 1
        step_ids = torch.tensor(nxt, dtype=torch.long)[:, None]
    return out
