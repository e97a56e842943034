"""dprc_core.generation against independent references: greedy decoding equals Hugging Face's
``model.generate`` for every prompt alone, a sampled row equals a no-cache reference loop
drawing from the same generator, and the nucleus rule's frequencies match its truncated
distribution (chi-square)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from dprc_core.generation import SamplingSettings, generate, sample_token

PROMPTS = [[5, 9, 3], [7], [11, 4, 2, 8, 6], [1, 2]]


def test_greedy_batch_equals_hf_generate_of_each_prompt_alone(tiny_llama):
    model = tiny_llama.float()
    settings = SamplingSettings(temperature=0, max_new_tokens=6)
    stop = frozenset({63})
    got = generate(model, PROMPTS, [0] * len(PROMPTS), settings, stop, pad_id=0)
    for prompt, row in zip(PROMPTS, got, strict=True):
        ref = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=6,
            eos_token_id=63,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        if 63 in ref:
            ref = ref[: ref.index(63)]
        assert row == ref


def _reference_sample(model, prompt, seed, settings):
    """Each token from a full forward of the sequence so far (no cache, no padding)."""
    generator = torch.Generator().manual_seed(seed)
    seq, out = list(prompt), []
    for _ in range(settings.max_new_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
        probs = torch.softmax(logits.float() / settings.temperature, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
        out.append(token)
        seq.append(token)
    return out


def test_sampled_rows_equal_a_no_cache_reference_with_the_same_generator(tiny_llama):
    model = tiny_llama.float()
    settings = SamplingSettings(temperature=1.3, max_new_tokens=5)
    seeds = [11, 12, 13, 14]
    got = generate(model, PROMPTS, seeds, settings, frozenset(), pad_id=0)
    for prompt, seed, row in zip(PROMPTS, seeds, got, strict=True):
        assert row == _reference_sample(model, prompt, seed, settings)


def test_top_p_draws_follow_the_truncated_distribution():
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    logits = probs.log()
    generator = torch.Generator().manual_seed(0)
    n = 4000
    counts = torch.zeros(5)
    for _ in range(n):
        counts[sample_token(logits, 1.0, 0.8, generator)] += 1
    # kept: the smallest prefix reaching 0.8, the crossing token included: 0.4, 0.3, 0.15
    assert counts[3:].sum() == 0
    kept = probs[:3] / probs[:3].sum()
    assert chisquare(counts[:3].numpy(), (kept * n).numpy()).pvalue > 1e-3
    assert sample_token(logits, 0, 0.5, None) == 0  # temperature 0: greedy


@pytest.mark.parametrize(
    "bad", [dict(temperature=-1), dict(temperature=2.5), dict(top_p=0), dict(max_new_tokens=0)]
)
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingSettings(**bad)
