"""Independent Gaussian noise N(0, σ²C²) per coordinate, once per logical batch."""

from __future__ import annotations

import torch


class GaussianNoise:
    """Draws ``std · N(0, 1)`` for each parameter from the engine's generators."""

    def __init__(self, std: float):
        if not std >= 0:
            raise ValueError(f"noise std must be >= 0, got {std}")
        self.std = float(std)

    def sample(
        self, index: int, like: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor | None:
        """Fresh noise for parameter ``index`` (independent of every other draw)."""
        if self.std == 0:
            return None
        noise = torch.randn(like.shape, generator=generator, dtype=like.dtype, device=like.device)
        return noise.mul_(self.std)

    def end_step(self) -> None:
        """Independent noise keeps no state between steps."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            raise ValueError("GaussianNoise keeps no state; got a non-empty state")
