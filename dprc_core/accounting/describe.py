"""How an event is described to people: the words the accountant CLI prints and the accountant
endpoint returns, from one place."""

from __future__ import annotations

from dprc_core.accounting.events import NU_DPFTRL, PrivacyEvent

ADJACENCY = {
    "gaussian": "add/remove, Poisson sampling, max over both directions",
    NU_DPFTRL: "zero-out (one example's gradients replaced by 0, implied by add/remove), "
    "fixed-order batches, no amplification by sampling",
}
NU_DPFTRL_ACCOUNTANT = (
    "analytic Gaussian mechanism (exact) with mu = sensitivity / sigma, the sensitivity of "
    "the implemented noise matrix (docs/accounting.md §9)"
)


def envelope_words(clipping: str, k: int | None, rank: int | None) -> str:
    """Which bound on the clipped contribution the accountant used."""
    if clipping == "exact":
        return "exact per-sample norms (sensitivity 1)"
    if clipping == "hutchpp" or rank is None:
        return f"{clipping}, k={k}, dimension-free envelope"
    return f"{clipping}, k={k}, rank-dependent envelope with total rank D={rank}"


def describe_event(event: PrivacyEvent) -> dict[str, str]:
    """``envelope`` and ``adjacency`` of an event, in words."""
    return {
        "envelope": envelope_words(event.clipping, event.k, event.rank),
        "adjacency": ADJACENCY[event.mechanism],
    }
