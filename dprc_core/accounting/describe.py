"""How an event is described to people: the words the accountant CLI prints and the accountant
endpoint returns, from one place."""

from __future__ import annotations

from dprc_core.accounting.events import (
    NU_DPFTRL,
    PER_EXAMPLE_SKETCH,
    SHARED_SKETCH,
    PrivacyEvent,
)

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


SKETCH_WORDS = {
    SHARED_SKETCH: "shared sketch (one projection per layer per step for the whole batch): "
    "revealed-scale model, the adversary is given each step's scale a",
    PER_EXAMPLE_SKETCH: "per-example sketches (independent projections per example, layer and "
    "step): hidden-scale model, one mixture over a per step (docs/accounting.md §10)",
}


def sketch_words(clipping: str, sketch: str) -> str:
    """How the accountant modelled the sketch (nothing to say for exact norms)."""
    if clipping == "exact":
        return "none (exact norms draw no sketch)"
    return SKETCH_WORDS[sketch]


def describe_event(event: PrivacyEvent) -> dict[str, str]:
    """``envelope``, ``sketch`` and ``adjacency`` of an event, in words."""
    return {
        "envelope": envelope_words(event.clipping, event.k, event.rank),
        "sketch": sketch_words(event.clipping, event.sketch),
        "adjacency": ADJACENCY[event.mechanism],
    }
