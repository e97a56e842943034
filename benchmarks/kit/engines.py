"""benchmarks/audit.py's engines (tests/dprc_core/auditing guards that they still run): the
real :class:`~dprc_core.PrivacyEngine` and deliberately broken subclasses the audits must
refute, built by :func:`factory`; :data:`CASES` lists the audit's rows."""

from __future__ import annotations

import math

import torch

from dprc_core import PrivacyEngine
from dprc_core.clipping import Clipping, norm_from_method
from dprc_core.noise import Gaussian, GaussianNoise

C, MICRO = 1.0, 8  # the clipping norm, the micro-batch of the per-micro-batch noise


class QuarterNoise(PrivacyEngine):
    """BROKEN: claims σ, adds σC/4."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.noise = GaussianNoise(self.noise_multiplier * self.max_grad_norm / 4)


class HalfNoise(PrivacyEngine):
    """BROKEN: claims σ, adds σC/2."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.noise = GaussianNoise(self.noise_multiplier * self.max_grad_norm / 2)


class NoClipping(PrivacyEngine):
    """BROKEN: per-sample clipping turned off (factors all 1); noise σC as claimed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_grad_norm = math.inf  # min(1, inf / n) = 1; the noise was built with C


class NoisePerMicroBatch(PrivacyEngine):
    """BROKEN: adds N(0, (σC/M)²) to every micro-batch, M the expected number of micro-batches
    per logical batch, and no noise at the step — total std σC·√M_real/M ≈ σC/√M."""

    def __init__(self, *args, micro_batch_size: int, **kwargs):
        super().__init__(*args, **kwargs)
        m = max(1, math.ceil(self.expected_batch_size / micro_batch_size))
        self._micro_noise = GaussianNoise(self.noise_multiplier * self.max_grad_norm / m)
        self.noise = GaussianNoise(0.0)

    def accumulate(self, loss_fn, batch, *args, **kwargs) -> None:
        super().accumulate(loss_fn, batch, *args, **kwargs)
        with torch.no_grad():
            for i, p in enumerate(self.params):
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                noise = self._micro_noise.sample(i, grad, self.generators(grad.device))
                assert noise is not None  # a Gaussian of std > 0 always draws
                p.grad = grad + noise


def factory(kind: str, sigma: float, method: str = "exact"):
    """``method``: a norm method, or ``"<method>/per_example"`` for per-example sketches."""
    norm_method, _, sketch = method.partition("/")

    def make(model, opt, expected_batch_size, seed):
        kw = dict(
            clipping=Clipping(C, norm_from_method(norm_method, k=32, sketch=sketch or "shared")),
            noise=Gaussian(sigma),
            expected_batch_size=expected_batch_size,
            seed=seed,
        )
        if kind == "real":
            return PrivacyEngine(model, opt, **kw)
        if kind == "half_noise":
            return HalfNoise(model, opt, **kw)
        if kind == "quarter_noise":
            return QuarterNoise(model, opt, **kw)
        if kind == "no_clipping":
            return NoClipping(model, opt, **kw)
        if kind == "noise_per_microbatch":
            return NoisePerMicroBatch(model, opt, micro_batch_size=MICRO, **kw)
        raise ValueError(kind)

    return make


CASES = [
    ("DP-SGD exact (real engine)", "real", "exact"),
    ("DP-SGD-RC hutch k=32 (real engine)", "real", "hutch"),
    ("DP-SGD-RC hutch++ k=32 (real engine)", "real", "hutchpp"),
    ("BROKEN: noise scaled down 4×", "quarter_noise", "exact"),
    ("BROKEN: clipping off", "no_clipping", "exact"),
    ("BROKEN: noise per micro-batch, std / M", "noise_per_microbatch", "exact"),
    ("DP-SGD-RC hutch k=32, per-example sketches (real engine)", "real", "hutch/per_example"),
    ("BROKEN: per-example sketches, half the noise", "half_noise", "hutch/per_example"),
    ("BROKEN: per-example sketches, noise scaled down 4×", "quarter_noise", "hutch/per_example"),
]
