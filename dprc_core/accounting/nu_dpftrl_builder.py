"""The PLD of a :class:`~dprc_core.accounting.events.NuDPFTRLEvent`.

A whole ν-DP-FTRL run is one Gaussian mechanism (μ = sensitivity/σ, no sampling): its PLD is
``dp_accounting``'s Gaussian PLD, pessimistic connect-the-dots on the common grid, composed
with the other events' (a PLD composition, never a sum of ε's). Its loss has std μ, so it
asks for h ≤ rel_h·μ like a one-step event. It counts as one mechanism in the tail budget, and
two runs are never merged: the steps of a run enter its sensitivity, and two runs are two
Gaussian mechanisms, not one longer run. Runs alone compose analytically (:meth:`gaussian_mu`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting.events import NuDPFTRLEvent
from dprc_core.accounting.pld_builders import GridNeeds, PLDBuilder, pld_builder
from dprc_core.accounting.settings import AccountingSettings


def gaussian_pld(mu: float, h: float, tail: float) -> PrivacyLossDistribution:
    """Pessimistic (connect-the-dots) PLD of the Gaussian mechanism with sensitivity μ, σ = 1;
    the truncated x-tails (mass ≤ tail) go to +∞ loss, i.e. into δ."""
    return pld_lib.from_gaussian_mechanism(
        1.0,
        sensitivity=mu,
        pessimistic_estimate=True,
        value_discretization_interval=h,
        log_mass_truncation_bound=math.log(tail),
        use_connect_dots=True,
    )


@dataclass(frozen=True)
class PreparedGaussianRun:
    event: NuDPFTRLEvent

    compositions = 1
    scale_bins = 1

    def grid_needs(self, settings: AccountingSettings) -> GridNeeds:
        """Loss ~ N(μ²/2, μ²): h ≤ rel_h·μ, ranges of ±12 (composed) and ±24 (one) std."""
        mu = self.event.mu
        return GridNeeds(settings.rel_h * mu, mu * mu + 24.0 * mu, mu * mu / 2 + 12.0 * mu)

    def pld(self, h: float, tail: float) -> PrivacyLossDistribution:
        return gaussian_pld(self.event.mu, h, tail)


@pld_builder(NuDPFTRLEvent)
class NuDPFTRLPLD(PLDBuilder[NuDPFTRLEvent]):
    def compositions(self, event: NuDPFTRLEvent) -> int:
        return 1

    def prepare(
        self, event: NuDPFTRLEvent, tail: float, settings: AccountingSettings
    ) -> PreparedGaussianRun:
        return PreparedGaussianRun(event)

    def gaussian_mu(self, event: NuDPFTRLEvent) -> float | None:
        return event.mu
