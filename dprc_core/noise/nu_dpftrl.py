"""ν-DP-FTRL correlated noise: z_t = Σ_{τ≤t} β_τ w_{t−τ}, β_τ = (−1)^τ binom(1/2, τ)(1−ν)^τ.

w_t ~ N(0, std² I) is drawn fresh at every step from the engine's generator (std = σ·C), and
the noise of step t is the Toeplitz combination of the current and the past draws. Memory is
bounded by **banding**: with ``bands = b`` only β_0 … β_{b−1} are used, so only the last b − 1
draws are kept per parameter.

Cost per step and parameter of n elements: one ``randn`` of n values, b multiply-adds of n
values; memory (b − 1)·n values (float32, or float64 for float64 parameters) in addition to
the parameter. ``bands=None`` (un-banded) keeps every past draw: memory t·n after t steps —
meant for small models, tests and short runs only. ``bands=1`` is independent Gaussian noise.

The privacy accounting must use the *same* ``nu`` and ``bands``
(:func:`dprc_core.accounting.dpftrl_sensitivity`): the sensitivity is that of the banded
matrix actually implemented here, not of the infinite Toeplitz one.

Contract with the caller (the engine): call :meth:`NuDPFTRLNoise.sample` once per parameter
per step, with the parameter's stable ``index`` and the same set of indices every step, then
:meth:`NuDPFTRLNoise.end_step` once. Violations raise ``RuntimeError`` instead of silently
misaligning the noise history.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from typing import Any

import torch

from dprc_core.accounting.dpftrl import check_bands, check_nu, nu_dpftrl_coefficients

_STATE_VERSION = 1


def _history_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class NuDPFTRLNoise:
    """Correlated ν-DP-FTRL noise with per-step std ``std`` (= noise multiplier × clipping
    norm), damping ``nu`` ∈ [0, 1] and optional banding ``bands`` (None: un-banded)."""

    def __init__(self, std: float, nu: float, bands: int | None = None):
        if not (isinstance(std, numbers.Real) and math.isfinite(std) and std >= 0):
            raise ValueError(f"noise std must be a finite number >= 0, got {std!r}")
        self.std: float = float(std)
        self.nu: float = check_nu(nu)
        self.bands: int | None = check_bands(bands)
        self.step: int = 0  # t: the step whose noise is being drawn
        self._beta: list[float] = [1.0]
        self._history: dict[int, deque[torch.Tensor]] = {}  # index → w_{t−1}, w_{t−2}, …
        self._seen: set[int] = set()
        self._indices: set[int] | None = None  # the indices of the first step

    # -- coefficients -------------------------------------------------------------------------
    def coefficients(self, n: int) -> list[float]:
        """β_0 … β_{n−1} as used (zero from ``bands`` on)."""
        return [float(b) for b in nu_dpftrl_coefficients(self.nu, n, self.bands)]

    def _kept(self) -> int | None:
        return None if self.bands is None else self.bands - 1

    def _beta_upto(self, n: int) -> list[float]:
        if len(self._beta) < n:
            self._beta = self.coefficients(max(n, 2 * len(self._beta)))
        return self._beta

    # -- the interface the engine uses --------------------------------------------------------
    def sample(
        self, index: int, like: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor | None:
        """The noise z_t for parameter ``index`` (shape, dtype, device of ``like``); None when
        std = 0 (no noise at all)."""
        if index in self._seen:
            raise RuntimeError(f"parameter index {index} sampled twice in step {self.step}")
        if self._indices is not None and index not in self._indices:
            raise RuntimeError(
                f"parameter index {index} was not sampled in earlier steps; the set of "
                "parameters must be the same every step"
            )
        self._seen.add(index)
        if self.std == 0:
            return None
        hist_dtype = _history_dtype(like.dtype)
        w = torch.randn(like.shape, generator=generator, dtype=hist_dtype, device=like.device)
        w.mul_(self.std)
        past = self._history.setdefault(index, deque(maxlen=self._kept()))
        if past and past[0].shape != like.shape:
            raise RuntimeError(
                f"parameter index {index} changed shape "
                f"({tuple(past[0].shape)} → {tuple(like.shape)})"
            )
        if past and past[0].device != like.device:  # e.g. a state loaded on the CPU
            moved = [x.to(like.device) for x in past]
            past.clear()
            past.extend(moved)
        beta = self._beta_upto(len(past) + 1)
        z = w.clone()
        for lag, w_past in enumerate(past, start=1):
            if beta[lag] != 0.0:
                z.add_(w_past, alpha=beta[lag])
        if self._kept() != 0:
            past.appendleft(w)
        return z.to(like.dtype)

    def end_step(self) -> None:
        """Advance t. Every parameter of the first step must have been sampled."""
        if self._indices is None:
            self._indices = set(self._seen)
        elif self._seen != self._indices:
            missing = sorted(self._indices - self._seen)
            raise RuntimeError(f"step {self.step} did not sample parameter indices {missing}")
        self._seen = set()
        self.step += 1

    # -- resume ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to continue the same noise sequence, as a flat dict of tensors
        (``safetensors.torch.save_file`` can write it; no pickle). Must be taken between steps.
        The generator's state is the caller's (the engine saves its generators)."""
        if self._seen:
            raise RuntimeError("state_dict() in the middle of a step; call end_step() first")
        state: dict[str, torch.Tensor] = {
            "meta.version": torch.tensor(_STATE_VERSION, dtype=torch.int64),
            "meta.step": torch.tensor(self.step, dtype=torch.int64),
            "meta.std": torch.tensor(self.std, dtype=torch.float64),
            "meta.nu": torch.tensor(self.nu, dtype=torch.float64),
            "meta.bands": torch.tensor(-1 if self.bands is None else self.bands),
            "meta.indices": torch.tensor(sorted(self._indices or ()), dtype=torch.int64),
        }
        for index, past in self._history.items():
            for lag, w in enumerate(past, start=1):
                state[f"history.{index}.{lag}"] = w.detach().clone().contiguous()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; ``std``, ``nu`` and ``bands`` must match this
        instance (a resumed run must keep the mechanism that is accounted)."""
        try:
            version = int(state["meta.version"])
            step = int(state["meta.step"])
            std = float(state["meta.std"])
            nu = float(state["meta.nu"])
            bands_raw = int(state["meta.bands"])
            indices = [int(i) for i in torch.as_tensor(state["meta.indices"]).tolist()]
        except KeyError as exc:
            raise ValueError(f"not a NuDPFTRLNoise state: missing {exc}") from exc
        if version != _STATE_VERSION:
            raise ValueError(f"unsupported NuDPFTRLNoise state version {version}")
        bands = None if bands_raw == -1 else bands_raw
        if (std, nu, bands) != (self.std, self.nu, self.bands):
            raise ValueError(
                f"state is for std={std}, nu={nu}, bands={bands}; this instance has "
                f"std={self.std}, nu={self.nu}, bands={self.bands}"
            )
        history: dict[int, dict[int, torch.Tensor]] = {}
        for key, value in state.items():
            if key.startswith("meta."):
                continue
            parts = key.split(".")
            if len(parts) != 3 or parts[0] != "history":
                raise ValueError(f"unknown NuDPFTRLNoise state key {key!r}")
            history.setdefault(int(parts[1]), {})[int(parts[2])] = value
        kept = self._kept()
        restored: dict[int, deque[torch.Tensor]] = {}
        for index, lags in history.items():
            n = len(lags)
            if sorted(lags) != list(range(1, n + 1)) or (kept is not None and n > kept):
                raise ValueError(f"inconsistent history for parameter index {index}")
            if n != (min(step, kept) if kept is not None else step):
                raise ValueError(f"history of parameter index {index} does not match step {step}")
            restored[index] = deque((lags[lag] for lag in range(1, n + 1)), maxlen=kept)
        if self.std > 0 and step > 0 and kept != 0 and set(restored) != set(indices):
            raise ValueError("the noise history does not cover every parameter index")
        self.step = step
        self._history = restored
        self._indices = set(indices) if step > 0 else None
        self._seen = set()
