"""The independence check within a training step's memory (issue 30): long token sequences
are compared in float64 on a short prefix and at full length only in the model's own dtype;
the float64 cast of the parameters is made only where it fits in the trainable parameters'
gradient bytes, else the check screens in a narrower dtype and settles any flag in float64.
It still refuses every mixing it refused, including mixing confined to the positions after
the prefix and mixing too small for float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import dprc_core
from dprc_core import Clipping, Exact, Gaussian, Hutch, SampleMixingError
from dprc_core.hooks import PerSampleHooks
from dprc_core.independence import (
    RTOL,
    SHORT,
    cast_bytes,
    check_dtype,
    check_sample_independence,
    gradient_bytes,
    sequence_length,
    short_length,
)

VOCAB, D = 40, 8


def _mean_pool(h: torch.Tensor) -> torch.Tensor:  # like BatchNorm's statistics
    return h - h.mean(0, keepdim=True)


def _late_pool(h: torch.Tensor) -> torch.Tensor:  # mixes only from position 2·SHORT on
    late = h[:, 2 * SHORT :]
    return torch.cat([h[:, : 2 * SHORT], late + 0.5 * late.mean(0, keepdim=True)], 1)


def _faint_pool(h: torch.Tensor) -> torch.Tensor:  # 1e-5: below float32's tolerance
    return h + 1e-5 * h.mean(0, keepdim=True)


class TokenLM(nn.Module):
    """Embedding → Linear → tanh → (mixing) → Linear head; records (T, dtype) of each run."""

    def __init__(self, mix=None, seq_first=False, pos_len: int | None = None):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.lin = nn.Linear(D, D)
        self.head = nn.Linear(D, VOCAB)
        self.mix, self.seq_first = mix, seq_first
        if pos_len is not None:  # a model that only runs at its full length
            self.register_buffer("pos", torch.arange(pos_len))
        self.runs: list[tuple[int, torch.dtype]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.runs.append((ids.shape[1], self.head.weight.dtype))
        h = self.emb(ids)
        if hasattr(self, "pos"):
            h = h.masked_fill(self.pos[None, :, None] < 0, 0.0)  # fails at another T
        if self.seq_first:  # (T, B, d), as FSMT does
            h = torch.tanh(self.lin(h.transpose(0, 1))).transpose(0, 1)
        else:
            h = torch.tanh(self.lin(h))
        if self.mix is not None:
            h = self.mix(h)
        return self.head(h)


def _loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["input_ids"])
    labels = batch["labels"]
    tokens = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return tokens.sum(1) / (labels != -100).sum(1).clamp(min=1)


def _batch(t: int, b: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids.clone()}


def _engine(model: nn.Module, norm=None) -> dprc_core.PrivacyEngine:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    return dprc_core.PrivacyEngine(
        model,
        opt,
        clipping=Clipping(1.0, norm or Exact()),
        noise=Gaussian(1.0),
        expected_batch_size=3.0,
        seed=0,
    )


def _check(model: nn.Module, batch) -> None:
    hooks = PerSampleHooks(model, verified_layouts=True)
    try:
        check_sample_independence(hooks, _loss, batch)
    finally:
        hooks.remove()


# ------------------------------------------------------------------ the short prefix
@pytest.mark.parametrize("t", [200, 201, 1024])
def test_long_token_sequences_go_to_float64_only_on_a_short_prefix(t):
    torch.manual_seed(0)
    model = TokenLM()
    _engine(model, Hutch(4)).step(_loss, _batch(t))
    t_check = short_length(t)
    assert t_check is not None and SHORT <= t_check < 2 * SHORT
    assert t_check % SHORT == t % SHORT and t_check not in (1, 2)  # T's parity, never B
    float64 = [n for n, dtype in model.runs if dtype == torch.float64]
    assert float64 == [t_check] * 3  # the pair and each sample alone
    own = [n for n, dtype in model.runs if dtype == torch.float32]
    assert own == [t] * 4  # the full length in float32: the check's 3 runs, then the step
    assert all(p.dtype == torch.float32 for p in model.parameters())


class _LargestFloat64(TorchDispatchMode):
    """The largest float64 tensor any operation returns (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.largest = max(self.largest, t.numel())
        return out


def test_no_float64_tensor_scales_with_the_full_length():
    """At T = 4096 the float64 logits of the pair would have 2·T·V elements; the check's
    largest float64 tensor is bounded by the prefix (2·T_check·V) whatever T is."""
    torch.manual_seed(0)
    t = 4096
    model = TokenLM()
    with _LargestFloat64() as mode:
        _check(model, _batch(t))
    assert 0 < mode.largest <= 2 * (2 * SHORT) * VOCAB < 2 * t * VOCAB // 32
    assert {n for n, dtype in model.runs if dtype == torch.float64} == {short_length(t)}


@pytest.mark.parametrize(
    "mix, seq_first",
    [(_mean_pool, False), (_late_pool, False), (_faint_pool, False), (None, True)],
    ids=["batch-mean", "late-positions-only", "faint-1e-5", "sequence-first"],
)
def test_mixing_is_still_refused_on_long_sequences(mix, seq_first):
    """Batch statistics, mixing confined to the positions after the prefix (the full-length
    pass in float32 flags it, float64 confirms), mixing of 1e-5 (found in float64 on the
    prefix), sequence-first layouts."""
    torch.manual_seed(0)
    with pytest.raises((SampleMixingError, ValueError), match="independent|batch-first"):
        _engine(TokenLM(mix, seq_first)).step(_loss, _batch(300))


def test_a_model_that_needs_its_full_length_is_checked_at_full_length():
    torch.manual_seed(0)
    model = TokenLM(pos_len=150)
    _check(model, _batch(150))
    # the prefix's pair fails (the model's own error), then the full length, as before
    assert [n for n, dtype in model.runs if dtype == torch.float64] == [short_length(150)] + [
        150
    ] * 3
    with pytest.raises(SampleMixingError, match="not independent"):
        _check(TokenLM(_mean_pool, pos_len=150), _batch(150))


def test_a_prefix_without_loss_leaves_the_decision_to_the_full_length():
    """Left padding: no label in the first 190 positions, so the prefix has nothing to
    compare (zero gradients); the full length decides, in float64."""
    torch.manual_seed(0)
    batch = _batch(200)
    batch["labels"][:, :190] = -100
    model = TokenLM()
    _check(model, batch)
    assert [n for n, dtype in model.runs if dtype == torch.float64] == [32 + 200 % 32] + [200] * 3
    with pytest.raises(SampleMixingError, match="not independent"):
        _check(TokenLM(_faint_pool), batch)


def test_sequence_length_reads_only_batches_of_token_sequences():
    ids = torch.zeros(2, 100, dtype=torch.long)
    assert sequence_length({"input_ids": ids, "labels": ids, "y": torch.zeros(2)}) == 100
    assert sequence_length((ids, torch.zeros(2, 100, 8))) == 100  # embeddings of the same T
    assert sequence_length(torch.randn(2, 100, 8)) is None  # features, no tokens
    assert sequence_length({"input_ids": ids, "decoder_input_ids": ids[:, :50]}) is None
    assert sequence_length({"input_ids": ids, "mask": torch.ones(2, 1, 100, 100)}) is None
    assert short_length(63) is None and short_length(64) == 32 and short_length(8191) == 63


# ------------------------------------------------------------------ the parameters' cast
def test_float64_cast_only_where_it_fits_in_the_gradients():
    full = TokenLM()  # float32, every parameter trained: the cast adds what gradients take
    hooks = PerSampleHooks(full)
    assert cast_bytes(full, torch.float64) == gradient_bytes(hooks)
    assert check_dtype(hooks) == (torch.float64, RTOL)
    hooks.remove()

    half = TokenLM().to(torch.bfloat16)  # 6 more bytes a parameter for 2 of gradient
    hooks = PerSampleHooks(half)
    assert cast_bytes(half, torch.float64) == 3 * gradient_bytes(hooks)
    dtype, rtol = check_dtype(hooks)
    assert dtype == torch.float32 and rtol == pytest.approx(256 * torch.finfo(torch.float32).eps)
    hooks.remove()

    frozen = TokenLM().to(torch.bfloat16)  # LoRA-like: a frozen base, a small trained part
    frozen.requires_grad_(False)
    frozen.lin.requires_grad_(True)
    hooks = PerSampleHooks(frozen)
    assert check_dtype(hooks) == (None, 0.05)  # its own dtypes, 5 % for bfloat16
    hooks.remove()


def test_the_screening_tolerance_follows_the_float32_matmul_precision():
    """TF32 matmuls (``set_float32_matmul_precision("high")``) round at 2^-10: a float32 screen
    at 3e-5 would flag every model and send it to the float64 comparison."""
    model = _frozen_base()
    hooks = PerSampleHooks(model)
    before = torch.get_float32_matmul_precision()
    try:
        assert check_dtype(hooks)[1] == pytest.approx(256 * torch.finfo(torch.float32).eps)
        torch.set_float32_matmul_precision("high")
        assert check_dtype(hooks)[1] == 0.05
    finally:
        torch.set_float32_matmul_precision(before)
        hooks.remove()


def _frozen_base(mix=None) -> TokenLM:
    """float32, every parameter frozen but ``lin``: the float64 cast would add 4 bytes for
    each frozen weight, which a step's gradients do not cover."""
    model = TokenLM(mix)
    model.requires_grad_(False)
    model.lin.requires_grad_(True)
    return model


def test_a_frozen_base_is_screened_without_a_float64_copy():
    torch.manual_seed(0)
    model = _frozen_base()
    hooks = PerSampleHooks(model, verified_layouts=True)
    assert check_dtype(hooks)[0] == torch.float32
    hooks.remove()
    _engine(model).step(_loss, _batch(40))  # T < 2·SHORT: the whole length
    assert model.runs and all(dtype == torch.float32 for _, dtype in model.runs)


def test_a_flagged_screen_is_settled_in_float64():
    torch.manual_seed(0)
    model = _frozen_base(_mean_pool)
    with pytest.raises(SampleMixingError, match="not independent"):
        _engine(model).step(_loss, _batch(40))
    assert [dtype for _, dtype in model.runs] == [torch.float32] * 3 + [torch.float64] * 4
    assert all(p.dtype == torch.float32 for p in model.parameters())
