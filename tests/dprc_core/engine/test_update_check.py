"""The engine's update check: after a step with a non-zero learning rate and a non-zero update,
at least one trainable parameter of the model must have changed, else it raises (the failure of
Opacus #820: parameters replaced after the optimizer was built, weights that never move)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dprc_core
from dprc_core import Clipping, Exact, Gaussian


def _loss(model, x):
    return model(x).pow(2).sum(1)


def _engine(model, lr=0.1, sigma=1.0):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    engine = dprc_core.PrivacyEngine(
        model,
        opt,
        clipping=Clipping(1.0, Exact()),
        noise=Gaussian(sigma),
        expected_batch_size=4.0,
        seed=0,
    )
    return engine, opt


def test_a_normal_step_passes_and_moves_the_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    before = [p.detach().clone() for p in model.parameters()]
    engine, _ = _engine(model)
    engine.step(_loss, torch.randn(4, 4))
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_parameters_replaced_after_the_optimizer_raise():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    engine, _ = _engine(model)
    # what .to() does under overwrite_module_params_on_conversion, or assign=True loading:
    # the model gets new Parameter objects; the optimizer keeps the old ones
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    with pytest.raises(RuntimeError, match="no trainable parameter of the model changed.*replaced"):
        engine.step(_loss, torch.randn(4, 4))


def test_peft_lora_moved_after_the_engine_was_built_raises():
    """The Opacus #820 order: LoRA wrapped, optimizer and engine built, then the model is
    converted with parameters overwritten (as .to(device) does for some tensor types)."""
    from peft import LoraConfig, get_peft_model

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            return self.out(torch.tanh(self.proj(x)))

    torch.manual_seed(0)
    model = get_peft_model(Tiny(), LoraConfig(r=2, target_modules=["proj"], lora_dropout=0.0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    engine, _ = _engine(model)
    old = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model.to(torch.float64)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(old)
    with pytest.raises(RuntimeError, match="no trainable parameter of the model changed"):
        engine.step(_loss, torch.randn(4, 4, dtype=torch.float64))


def test_a_zero_learning_rate_or_a_zero_update_does_not_raise():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 2))
    engine, _ = _engine(model, lr=0.0)
    before = [p.detach().clone() for p in model.parameters()]
    engine.step(_loss, torch.randn(4, 4))  # lr 0: nothing should move, nothing raised
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    with pytest.warns(dprc_core.PrivacyWarning):
        engine, _ = _engine(model, sigma=0.0)
    engine.step(_loss, torch.randn(0, 4))  # σ = 0 and an empty Poisson batch: a zero update
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
