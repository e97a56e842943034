"""How an event is described to people: the words the accountant CLI prints and the accountant
endpoint returns, from one place."""

from __future__ import annotations

from dprc_core.accounting.events import (
    NU_DPFTRL,
    PER_EXAMPLE_SKETCH,
    SHARED_SKETCH,
    PrivacyEvent,
)
from dprc_core.accounting.renamed_keywords import renamed_keyword

ADJACENCY = {
    "gaussian": "add/remove, Poisson sampling, max over both directions",
    NU_DPFTRL: "zero-out (one example's gradients replaced by 0, implied by add/remove), "
    "fixed-order batches, no amplification by sampling",
}
NU_DPFTRL_ACCOUNTANT = (
    "analytic Gaussian mechanism (exact) with mu = sensitivity / sigma, the sensitivity of "
    "the implemented noise matrix (docs/accounting.md §9)"
)


@renamed_keyword("clipping", "envelope")
def envelope_words(
    envelope: str, k: int | None, rank: int | None, *, clipping: str | None = None
) -> str:
    """Which envelope — the bound on the clipped contribution — the accountant used
    (``clipping``: the deprecated name of ``envelope``)."""
    if envelope == "exact":
        return "exact per-sample norms (sensitivity 1)"
    if envelope == "hutchpp" or rank is None:
        return f"{envelope}, k={k}, dimension-free envelope"
    return f"{envelope}, k={k}, rank-dependent envelope with total rank D={rank}"


SKETCH_WORDS = {
    SHARED_SKETCH: "shared sketch (one projection per layer per step for the whole batch): "
    "revealed-scale model, the adversary is given each step's scale a",
    PER_EXAMPLE_SKETCH: "per-example sketches (independent projections per example, layer and "
    "step): hidden-scale model, one mixture over a per step (docs/accounting.md §10)",
}


@renamed_keyword("clipping", "envelope")
def sketch_words(envelope: str, sketch: str, *, clipping: str | None = None) -> str:
    """How the accountant modelled the sketch of an event with this envelope (nothing to say
    for exact norms; ``clipping``: the deprecated name of ``envelope``)."""
    if envelope == "exact":
        return "none (exact norms draw no sketch)"
    return SKETCH_WORDS[sketch]


def describe_event(event: PrivacyEvent) -> dict[str, str]:
    """``envelope``, ``sketch`` and ``adjacency`` of an event, in words."""
    return {
        "envelope": envelope_words(event.envelope, event.k, event.rank),
        "sketch": sketch_words(event.envelope, event.sketch),
        "adjacency": ADJACENCY[event.mechanism],
    }
