"""Training utilities: Poisson sampling and the end-to-end library demo."""

from dprc_core.training.sampling import PoissonSampler

__all__ = ["PoissonSampler"]
