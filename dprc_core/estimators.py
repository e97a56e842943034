"""Per-sample squared gradient norms from layer factors: pure tensor math.

A linear-like layer contributes, for sample ``i``, a gradient matrix ``M_i = L_iᵀ R_i`` of the
parameter's shape ``(r, c)``, where ``L_i ∈ R^{T×r}`` and ``R_i ∈ R^{T×c}`` are *factors*:

* ``nn.Linear`` (weight ``(out, in)``): ``L = G`` (output grads), ``R = A`` (activations);
* HF ``Conv1D`` (weight ``(in, out)``): ``L = A``, ``R = G``;
* ``nn.Embedding`` (weight ``(V, d)``): ``L = one-hot(ids)`` (never materialised), ``R = G``.

A parameter used by several modules (tied weights) has several contributions; its per-sample
gradient is the **sum** ``M_i = Σ_c L_{c,i}ᵀ R_{c,i}`` and every method here works on that sum:
exact methods include the cross terms, sketches share one projection and add the sketches
before taking the norm.

Methods (docs/design.md §2; the registry of names is :mod:`dprc_core.norm_methods`):

* ``fgc``    materialise ``M_i`` (sparse rows only for one-hot factors);
* ``ghost``  ``‖M_i‖² = Σ_{a,b} ⟨L_a L_bᵀ, R_a R_bᵀ⟩`` — memory O(B·T²);
* ``hutch``  ``‖M_iᵀ P‖²`` (or ``‖M_i P‖²``) with ``P`` of i.i.d. N(0, 1/k) entries projecting
  the larger of the two dimensions — memory O(B·k·T + k·p);
  ``P`` is shared by the batch (a ``torch.Generator`` draws it) or per example (``P_i``, a
  :class:`ProjectionDraws` draws a (B, n, k) stack: :mod:`dprc_core.sketches`) — the same
  formulas either way, the per-example one with B·k·p more transient memory;
* ``hutchpp`` Hutch++: head ``‖M_iᵀQ_i‖²`` with ``Q_i`` an orthonormal basis of
  ``M_i M_iᵀ S``, tail ``‖M_iᵀP − (M_iᵀQ_i)(Q_iᵀP)‖²`` (the paper's three-term formula).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import torch


class ProjectionDraws(Protocol):
    """Per-example projections of one parameter: each ``draw`` is a (B, n, k) stack of
    independent N(0, 1/k) matrices, one per example (dprc_core.sketches.ExampleProjections)."""

    def draw(self, n: int, k: int, *, dtype: torch.dtype) -> torch.Tensor: ...


# Where a sketch's projections come from: a generator (one projection shared by the batch;
# None: torch's default generator) or per-example draws.
ProjectionSource = torch.Generator | ProjectionDraws | None


# --------------------------------------------------------------------------------------------
# Factors: dense (B, T, n) tensors or one-hot index tensors (B, T) into a dimension of size n.
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OneHot:
    """A one-hot factor ``X[b, t, :] = e_{indices[b, t]}``; ``indices < 0`` means a zero row."""

    indices: torch.Tensor  # (B, T) long
    size: int

    @property
    def shape(self) -> tuple[int, int, int]:
        b, t = self.indices.shape
        return (b, t, self.size)

    def valid(self) -> torch.Tensor:
        return self.indices >= 0

    def safe_indices(self) -> torch.Tensor:
        return self.indices.clamp(min=0)


Factor = torch.Tensor | OneHot


def _dim(x: Factor) -> int:
    return x.size if isinstance(x, OneHot) else x.shape[-1]


def _len(x: Factor) -> int:
    return x.indices.shape[1] if isinstance(x, OneHot) else x.shape[1]


def gram(x: Factor, y: Factor, dtype: torch.dtype) -> torch.Tensor:
    """Per-sample ``X_i Y_iᵀ`` of shape (B, T_x, T_y)."""
    if isinstance(x, OneHot) and isinstance(y, OneHot):
        eq = x.indices[:, :, None] == y.indices[:, None, :]
        eq &= x.valid()[:, :, None] & y.valid()[:, None, :]
        return eq.to(dtype)
    if isinstance(x, OneHot):
        return gram(y, x, dtype).transpose(1, 2)
    if isinstance(y, OneHot):
        # (X Yᵀ)[t, s] = X[t, idx[s]]
        b, tx, _ = x.shape
        idx = y.safe_indices()[:, None, :].expand(b, tx, -1)
        return x.gather(2, idx) * y.valid()[:, None, :].to(x.dtype)
    return torch.bmm(x, y.transpose(1, 2))


def project(x: Factor, p: torch.Tensor) -> torch.Tensor:
    """``X_i P`` (B, T, k) for a shared ``P`` (n, k) or per-sample ``P`` (B, n, k)."""
    if isinstance(x, OneHot):
        idx = x.safe_indices()
        if p.dim() == 2:
            out = p[idx]
        else:
            k = p.shape[-1]
            out = p.gather(1, idx[:, :, None].expand(-1, -1, k))
        return out * x.valid()[:, :, None].to(out.dtype)
    return x @ p if p.dim() == 2 else torch.bmm(x, p)


def transpose_apply(x: Factor, y: torch.Tensor) -> torch.Tensor:
    """``X_iᵀ Y_i`` (B, n, k) for per-sample ``Y`` (B, T, k)."""
    if isinstance(x, OneHot):
        b, _, k = y.shape
        out = y.new_zeros(b, x.size, k)
        y = y * x.valid()[:, :, None].to(y.dtype)
        return out.scatter_add_(1, x.safe_indices()[:, :, None].expand(-1, -1, k), y)
    return torch.bmm(x.transpose(1, 2), y)


# --------------------------------------------------------------------------------------------
# Contributions
# --------------------------------------------------------------------------------------------
@dataclass
class MatrixContribution:
    """Sample i's gradient contribution ``L_iᵀ R_i`` to a 2-D parameter of shape (r, c)."""

    left: Factor  # (B, T, r)
    right: Factor  # (B, T, c)

    @property
    def rows(self) -> int:
        return _dim(self.left)

    @property
    def cols(self) -> int:
        return _dim(self.right)

    @property
    def seq_len(self) -> int:
        return _len(self.left)

    def t(self) -> MatrixContribution:
        return MatrixContribution(self.right, self.left)

    def apply_t(self, x: torch.Tensor) -> torch.Tensor:
        """``M_iᵀ X`` (B, c, k) for X shared (r, k) or per-sample (B, r, k)."""
        if isinstance(self.right, OneHot):
            return transpose_apply(self.right, project(self.left, x))
        return torch.bmm(self.right.transpose(1, 2), project(self.left, x))

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``M_i X`` (B, r, k) for X shared (c, k) or per-sample (B, c, k)."""
        return self.t().apply_t(x)

    def materialize(self, dtype: torch.dtype) -> torch.Tensor:
        """Dense per-sample gradients (B, r, c)."""
        left, right = self.left, self.right
        if isinstance(right, OneHot):
            if isinstance(left, OneHot):
                raise ValueError("a contribution needs at least one dense factor")
            return self.t().materialize(dtype).transpose(1, 2)
        if not isinstance(left, OneHot):
            left = left.to(dtype)
        return transpose_apply(left, right.to(dtype))

    def weighted_sum(self, weights: torch.Tensor) -> torch.Tensor:
        """``Σ_i w_i M_i`` (r, c): the book-keeping clipped sum."""
        left, right = self.left, self.right
        if isinstance(left, OneHot):
            b, t = left.indices.shape
            # a contribution has at least one dense factor: right is a tensor here
            rows = (cast(torch.Tensor, right) * weights[:, None, None]).reshape(b * t, -1)
            valid = left.valid().reshape(-1)
            out = rows.new_zeros(left.size, rows.shape[1])
            return out.index_add_(0, left.indices.reshape(-1)[valid], rows[valid])
        if isinstance(right, OneHot):
            return self.t().weighted_sum(weights).t()
        # under autocast the two factors can differ (bf16 activations, fp32 output grads)
        dtype = torch.promote_types(left.dtype, right.dtype)
        lw = left.to(dtype) * weights.to(dtype)[:, None, None]
        return lw.reshape(-1, left.shape[-1]).t() @ right.to(dtype).reshape(-1, right.shape[-1])


def _sq(x: torch.Tensor) -> torch.Tensor:
    """Per-sample squared Frobenius norm of a (B, ...) tensor."""
    return x.pow(2).flatten(1).sum(1)


def vector_sq_norms(vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-sample squared norms of a 1-D parameter's summed per-sample gradients (B, n)."""
    total = vectors[0]
    for v in vectors[1:]:
        total = total + v
    return _sq(total)


def _all_one_hot_left(contribs: Sequence[MatrixContribution]) -> bool:
    return all(isinstance(c.left, OneHot) and not isinstance(c.right, OneHot) for c in contribs)


def fgc_sq_norms(contribs: Sequence[MatrixContribution], dtype: torch.dtype) -> torch.Tensor:
    """Exact, by instantiating per-sample gradients (only touched rows for one-hot factors)."""
    if _all_one_hot_left(contribs):
        return _sparse_rows_sq_norms(contribs, dtype)
    total = contribs[0].materialize(dtype)
    for c in contribs[1:]:
        total = total + c.materialize(dtype)
    return _sq(total)


def _sparse_rows_sq_norms(
    contribs: Sequence[MatrixContribution], dtype: torch.dtype
) -> torch.Tensor:
    """Embedding-style gradients: segment-sum rows by (sample, token); memory O(B·T·c)."""
    # only called when _all_one_hot_left(contribs): every left factor is a OneHot, every
    # right factor dense
    b = cast(OneHot, contribs[0].left).indices.shape[0]
    size = contribs[0].rows
    keys, rows = [], []
    for c in contribs:
        left = cast(OneHot, c.left)
        sample = torch.arange(b, device=left.indices.device)[:, None].expand_as(left.indices)
        valid = left.valid()
        keys.append((sample * size + left.indices)[valid])
        rows.append(cast(torch.Tensor, c.right).to(dtype)[valid])
    key = torch.cat(keys)
    row = torch.cat(rows)
    uniq, inverse = torch.unique(key, return_inverse=True)
    summed = row.new_zeros(uniq.shape[0], row.shape[1]).index_add_(0, inverse, row)
    per_row = summed.pow(2).sum(1)
    return per_row.new_zeros(b).index_add_(0, torch.div(uniq, size, rounding_mode="floor"), per_row)


def ghost_sq_norms(contribs: Sequence[MatrixContribution], dtype: torch.dtype) -> torch.Tensor:
    """Exact, by Gram matrices: ``Σ_{a,b} ⟨L_a L_bᵀ, R_a R_bᵀ⟩`` (cross terms included)."""
    contribs = [_cast(c, dtype) for c in contribs]
    total = None
    for a, ca in enumerate(contribs):
        for b in range(a, len(contribs)):
            cb = contribs[b]
            term = (gram(ca.left, cb.left, dtype) * gram(ca.right, cb.right, dtype)).sum((1, 2))
            term = term if a == b else 2 * term
            total = term if total is None else total + term
    assert total is not None
    return total


def exact_choice(contribs: Sequence[MatrixContribution]) -> str:
    """fastDP's rule, extended to tied parameters: ghost iff 2·(Σ T)² ≤ r·c."""
    if _all_one_hot_left(contribs):
        return "fgc"  # sparse rows: O(T·c), never worse than ghost
    t = sum(c.seq_len for c in contribs)
    return "ghost" if 2 * t * t <= contribs[0].rows * contribs[0].cols else "fgc"


def auto_method(t: int, r: int, c: int, one_hot: bool, k: int) -> str:
    """``auto`` for a parameter (r, c) seen over t tokens in total: exact where its per-sample
    memory is at most the sketch's, else hutch. Returns fgc | ghost | hutch."""
    if one_hot:
        return "fgc" if t * c <= k * (t + r + c) else "hutch"
    exact = "ghost" if 2 * t * t <= r * c else "fgc"
    return exact if min(2 * t * t, r * c) <= k * (t + r + c) else "hutch"


def auto_choice(contribs: Sequence[MatrixContribution], k: int) -> str:
    """``auto`` for one batch's contributions (see :func:`auto_method`)."""
    t = sum(c.seq_len for c in contribs)
    return auto_method(t, contribs[0].rows, contribs[0].cols, _all_one_hot_left(contribs), k)


def _oriented(contribs: Sequence[MatrixContribution]) -> tuple[list[MatrixContribution], int]:
    """Orient so that the projected (larger) dimension is the row dimension."""
    r, c = contribs[0].rows, contribs[0].cols
    if r >= c:
        return list(contribs), r
    return [x.t() for x in contribs], c


def gaussian_sketch(
    n: int, k: int, *, generator: torch.Generator | None, dtype: torch.dtype, device
) -> torch.Tensor:
    """An (n, k) matrix of i.i.d. N(0, 1/k) entries."""
    p = torch.randn(n, k, generator=generator, dtype=dtype, device=device)
    return p.mul_(k**-0.5)


def draw_projection(
    source: ProjectionSource, n: int, k: int, *, dtype: torch.dtype, device
) -> torch.Tensor:
    """The next projection: (n, k) shared by the batch, or (B, n, k) one per example."""
    if source is None or isinstance(source, torch.Generator):
        return gaussian_sketch(n, k, generator=source, dtype=dtype, device=device)
    return source.draw(n, k, dtype=dtype)


def hutch_sq_norms(
    contribs: Sequence[MatrixContribution],
    k: int,
    *,
    generator: ProjectionSource,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Hutchinson: ``‖Σ_c M_cᵀ P‖²`` with P over the larger dimension, shared by the batch or
    per example (``generator``: see :data:`ProjectionSource`)."""
    oriented, n = _oriented(contribs)
    device = _device(contribs[0])
    p = draw_projection(generator, n, k, dtype=dtype, device=device)
    return _sq(_sum_apply_t(oriented, p, dtype))


def hutchpp_sq_norms(
    contribs: Sequence[MatrixContribution],
    k: int,
    *,
    generator: ProjectionSource,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Hutch++ (Meyer et al. 2021) with k columns each for S, Q and P (paper §4); S and P
    shared by the batch or per example."""
    oriented, n = _oriented(contribs)
    device = _device(contribs[0])
    s = draw_projection(generator, n, k, dtype=dtype, device=device)
    p = draw_projection(generator, n, k, dtype=dtype, device=device)
    mts = _sum_apply_t(oriented, s, dtype)  # (B, c, k) = Mᵀ S
    y = _sum_apply(oriented, mts, dtype)  # (B, n, k) = M Mᵀ S
    q, _ = torch.linalg.qr(y)  # (B, n, min(n, k)), orthonormal columns
    mtq = _sum_apply_t(oriented, q, dtype)  # Mᵀ Q
    head = _sq(mtq)
    mtp = _sum_apply_t(oriented, p, dtype)  # Mᵀ P
    qtp = q.transpose(1, 2) @ p  # (B, k, k)
    tail = _sq(mtp - torch.bmm(mtq, qtp))
    return head + tail


def _device(c: MatrixContribution) -> torch.device:
    f = c.left if not isinstance(c.left, OneHot) else c.right
    return f.indices.device if isinstance(f, OneHot) else f.device


def _cast(c: MatrixContribution, dtype: torch.dtype) -> MatrixContribution:
    left = c.left if isinstance(c.left, OneHot) else c.left.to(dtype)
    right = c.right if isinstance(c.right, OneHot) else c.right.to(dtype)
    return MatrixContribution(left, right)


def _sum_apply_t(
    contribs: Sequence[MatrixContribution], x: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    out: torch.Tensor | None = None
    for c in contribs:
        y = _cast(c, dtype).apply_t(x)
        out = y if out is None else out + y
    assert out is not None  # the callers have read contribs[0]: there is a contribution
    return out


def _sum_apply(
    contribs: Sequence[MatrixContribution], x: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    out: torch.Tensor | None = None
    for c in contribs:
        y = _cast(c, dtype).apply(x)
        out = y if out is None else out + y
    assert out is not None  # the callers have read contribs[0]: there is a contribution
    return out
