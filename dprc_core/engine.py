"""PrivacyEngine: the DP-SGD-RC step (docs/design.md §3).

One logical (Poisson-sampled) batch, possibly split into micro-batches:

1. forward; 2. norm backward yielding per-sample norm estimates n̂_i (no parameter gradients);
3. clip factors c_i = min(1, C / n̂_i); 4. clipped sum Σ_i c_i g_i, either by a second backward
on Σ_i c_i L_i (``Clipping(clipped_sum="two_pass")``) or from the stored layer factors or
per-sample gradients, whichever is smaller (``clipped_sum="bookkeeping"``, the default: no
second backward); 5. once per logical batch: add the noise (``Gaussian(σ)``: N(0, σ²C²) per
coordinate), divide by the expected batch size, ``optimizer.step()``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from dprc_core import sharding
from dprc_core.accounting.events import PrivacyEvent
from dprc_core.batching import batch_size, select_samples
from dprc_core.clipping import (
    CLIPPED_SUMS,
    DEFAULT_K,
    Auto,
    Clipping,
    Exact,
    NormChoice,
    check_k,
    finite_number,
    norm_from_method,
)
from dprc_core.distributed import (
    all_gather_ints,
    all_reduce_sum,
    broadcast_int,
    broadcast_object,
    check_same_on_all_ranks,
    current_ranks,
    parameter_fingerprint,
    refuse_wrapped_model,
)
from dprc_core.estimators import MatrixContribution, auto_method
from dprc_core.hooks import PerSampleHooks, trainable_parameters
from dprc_core.independence import check_sample_independence
from dprc_core.noise import (
    GaussianNoise,
    NoiseMechanism,
    NuDPFTRLNoise,
    SecureGaussianNoise,
    SecureStream,
    as_noise_mechanism,
)
from dprc_core.noise.mechanisms import Schedule, check_noise_multiplier
from dprc_core.norm_methods import envelope_for, get_norm_method
from dprc_core.privacy_units import UnitGroups, group_rows
from dprc_core.seeding import derive_seed, fresh_seed
from dprc_core.sketches import PER_EXAMPLE_SKETCH, SHARED_SKETCH, per_example_source

LossFn = Callable[[nn.Module, Any], torch.Tensor]
CLIPPING_MODES = CLIPPED_SUMS  # the values of Clipping.clipped_sum


@dataclass
class StepStats:
    """What one logical batch did."""

    step: int
    batch_size: int  # samples actually in the logical batch (Poisson: random)
    # (batch_size,) estimated per-sample gradient norms (non-finite for dropped samples; in
    # two_pass mode a batch with dropped samples lists those first)
    per_sample_norms: torch.Tensor
    clipped_fraction: float  # fraction of samples with c_i < 1 (0.0 for an empty batch)
    mean_loss: float  # mean per-sample loss (nan for an empty batch)
    methods: dict[str, str] = field(default_factory=dict)  # parameter -> norm method used
    # samples whose loss, norm or gradient was not finite (NaN / inf): removed from the update
    # entirely (zero contribution) and not counted in clipped_fraction or mean_loss
    dropped: int = 0


class PrivacyWarning(UserWarning):
    """A setting that makes a run not (meaningfully) private."""


def _check_method(method: str) -> str:
    get_norm_method(method)  # raises for an unknown name
    return method


class _Generators:
    """One torch.Generator per device, each seeded with ``derive_seed(seed, purpose, i)``
    (never with the user seed itself: see :mod:`dprc_core.seeding`)."""

    def __init__(self, seed: int, purpose: str = "engine"):
        self.seed = seed
        self.purpose = purpose
        self._by_device: dict[str, torch.Generator] = {}

    def __call__(self, device: torch.device | str, _name: str = "") -> torch.Generator:
        device = torch.device(device)
        key = str(device)
        if key not in self._by_device:
            gen = torch.Generator(device=device)
            gen.manual_seed(derive_seed(self.seed, self.purpose, len(self._by_device)))
            self._by_device[key] = gen
        return self._by_device[key]


def per_sample_grad_norms(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    method: str = "exact",
    k: int = 32,
    generator: torch.Generator | None = None,
    check_independence: bool = True,
) -> torch.Tensor:
    """L2 norm of each sample's gradient over all parameters with ``requires_grad=True``.

    ``loss_fn(model, batch)`` must return per-sample losses of shape [B]. Leaves no ``.grad``
    behind. ``method``: fgc | ghost | exact | hutch | hutchpp | auto (see docs/design.md §2).
    ``check_independence=True`` (the default, as for :class:`PrivacyEngine`) first runs the
    per-sample independence check on the batch's first two samples, which verifies the layouts
    that are not plainly batch-first (batch-major flattened, shared by the batch) and accepts
    them. With ``False`` those layouts are refused, and a layout whose leading dimension is
    not the batch but happens to equal it (T == B) is not detected.
    """
    _check_method(method)
    check_k(k)
    hooks = PerSampleHooks(model, verified_layouts=check_independence)
    try:
        if check_independence and (batch_size(batch) or 0) >= 2:
            check_sample_independence(hooks, loss_fn, batch, method, k)
        _, result = hooks.norm_pass(
            loss_fn,
            batch,
            method=method,
            k=k,
            generator_for=lambda device, _name: generator,
            retain_graph=False,
            keep_contributions=False,
        )
    finally:
        hooks.remove()
    return result.sq_norms.clamp(min=0).sqrt()


class PrivacyEngine:
    """DP-SGD with (randomized) per-sample clipping for a model and its optimizer.

    ``PrivacyEngine(model, optimizer, clipping=Clipping(C, Hutch(k)), noise=Gaussian(σ),
    expected_batch_size=q·N)``: each logical batch's per-sample gradients are clipped as
    ``clipping`` says (:mod:`dprc_core.clipping`), summed, noised as ``noise`` says
    (:mod:`dprc_core.noise.mechanisms`) and divided by ``expected_batch_size`` before
    ``optimizer.step()``. :meth:`privacy_event` is the event an accountant counts for it.
    """

    # the state of the logical batch being accumulated, (re)set by _reset_batch()
    _in_batch: bool
    _norms: list[torch.Tensor]
    _losses: list[torch.Tensor]
    _clipped: int
    _dropped: int
    _methods: dict[str, str]
    _unit: str | None  # "example" | "user": the logical batch's privacy unit, once known

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        clipping: Clipping | None = None,
        noise: NoiseMechanism | None = None,
        expected_batch_size: float,
        seed: int | None = None,
        process_group: Any = None,
        secure_stream: SecureStream | None = None,
        **deprecated: Any,
    ):
        """Parameters:

        * ``model``: the (unwrapped) model; its parameters with ``requires_grad=True`` are
          trained. ``optimizer``: holds only those parameters (else refused).
        * ``clipping``: :class:`~dprc_core.clipping.Clipping` — the clipping norm C, the norm
          method (``Exact()``, ``Hutch(k, sketch)``, ``HutchPP(k, sketch)``,
          ``Auto(max_seq_len, k, sketch)``), how the clipped sum is formed
          (``clipped_sum``) and whether sample independence is checked.
        * ``noise``: ``Gaussian(σ, secure=...)`` or ``NuDPFTRL(σ, nu, bands)`` (exact norm
          methods only). σ = 0 warns (:class:`PrivacyWarning`): the run is not private.
        * ``expected_batch_size``: q·N, the expected (Poisson) logical batch size; the noised
          sum is divided by it. With several ranks it is the *global* one.
        * ``seed``: the secret seed of the noise and the projections (None: fresh from the
          OS). ``Gaussian(σ, secure=True)``: the noise comes from a ChaCha20 keystream keyed
          from the OS, as a float64 sum of normals generated one step ahead in a background
          thread, and ``seed`` then no longer determines it (docs/engine.md, "Secure mode");
          per-example projections then come from the stream too.
        * ``process_group``: inside an initialised ``torch.distributed`` process group
          (default: the default group) every rank builds the same engine for its copy of the
          model; each rank accumulates its part of the logical batch, ``step()`` adds rank
          0's single noise draw and SUM-reduces the clipped sums, so every rank takes the
          same update. The seed is rank 0's.
        * ``secure_stream``: secure mode's root :class:`~dprc_core.noise.SecureStream` (e.g.
          to resume); None: a fresh OS key. Unused without secure noise.

        A randomized method's ``sketch``: ``"per_example"`` (the default,
        :func:`~dprc_core.accounting.events.default_sketch`) — an independent projection per
        example, keyed by (secret, step, parameter, example id: ``accumulate(...,
        example_ids=)``), accounted with the hidden-scale model (docs/accounting.md §10) — or
        ``"shared"`` — one projection per parameter per logical batch, accounted with the
        revealed-scale model (a larger σ for the same ε).

        The keyword form ``max_grad_norm=, noise_multiplier=, norm_method=, k=,
        clipping_mode=, max_seq_len=, check_independence=, noise_mechanism=, nu=, bands=,
        secure_rng=, sketch=`` is deprecated (one DeprecationWarning) and converted into the
        same objects; it cannot be mixed with ``clipping=`` / ``noise=``."""
        clipping, noise = _mechanism_objects(clipping, noise, deprecated)
        self.model = model
        self.optimizer = optimizer
        self.clipping: Clipping = clipping
        self.mechanism: NoiseMechanism = noise
        self.max_grad_norm: float = clipping.max_grad_norm  # C, and σ: what the step uses
        self.noise_multiplier: float = _sigma(noise)
        self.expected_batch_size = finite_number(
            "expected_batch_size", expected_batch_size, positive=True
        )
        self.params = trainable_parameters(model)
        self._check_optimizer()
        refuse_wrapped_model(model)
        self.ranks = current_ranks(process_group)
        self._comm_device = self.params[0].device if self.params else torch.device("cpu")
        self._check_sharding()
        self._warn_if_not_private()
        self._seed_group(seed)
        self._make_noise(secure_stream)
        self.hooks = PerSampleHooks(model, verified_layouts=self.check_independence)
        self._independence_checked = False
        self.layer_methods: dict[str, str] = self._resolve_layer_methods()
        check_same_on_all_ranks("the engine's settings", self._fingerprint(), self.ranks)
        self.steps = 0
        self._reset_batch()

    # -- construction
    def _check_sharding(self) -> None:
        """FSDP2-sharded parameters (:mod:`dprc_core.sharding`): where each rank's rows sit,
        and what sharding does not take (two-pass clipping, correlated noise)."""
        self.sharded: bool = sharding.check_sharded_model(self.model, self.params)
        self._layouts: list[sharding.ShardLayout] = []
        # sharded: this rank's rows of the batch's clipped sum (reduced after each micro-batch)
        self._shard_sums: dict[int, torch.Tensor] = {}
        if not self.sharded:
            return
        if self.clipped_sum == "two_pass":
            raise ValueError(
                "clipped_sum='two_pass' with a sharded (FSDP2) model: its second backward "
                "would go through FSDP's reduce-scatter once per micro-batch, a collective that "
                "ranks with different numbers of micro-batches cannot join together; the "
                "sharded engine forms the clipped sum by book-keeping (the default)"
            )
        if not self.mechanism.shardable:
            raise ValueError(
                f"{self.mechanism.name} noise with a sharded (FSDP2) model: its correlated "
                "state is not sharded yet; use Gaussian noise (DP-SGD) or an unsharded model"
            )
        self._layouts = [sharding.shard_layout(p, self.ranks) for p in self.params]

    def _warn_if_not_private(self) -> None:
        if self.noise_multiplier == 0:
            warnings.warn(
                "noise_multiplier=0: no noise is added, the updates are NOT differentially "
                "private (clipping alone gives no privacy guarantee)",
                PrivacyWarning,
                stacklevel=3,
            )

    def _seed_group(self, seed: int | None) -> None:
        """The secret seed (rank 0's for a group) and the noise's generators from it."""
        self.seed = fresh_seed() if seed is None else int(seed)
        if self.ranks.distributed:  # one secret seed for the group: rank 0's
            self.seed = broadcast_int(self.seed, self.ranks)
        self.generators = _Generators(self.seed)  # the noise's (rank 0 draws it)
        if self.sharded:  # each rank noises its own rows, from a stream of its own
            self.generators = _Generators(self.seed, f"noise-shard/{self.ranks.rank}")

    def _make_noise(self, secure_stream: SecureStream | None) -> None:
        """The noise sampler, and secure mode's per-example projection stream (one key for
        every rank: the root's)."""
        self._projection_stream: SecureStream | None = None
        if self.secure_rng and self.sketch == PER_EXAMPLE_SKETCH:
            root = secure_stream if secure_stream is not None else SecureStream()
            self._projection_stream = root.derive("projections")
        self.noise: GaussianNoise | NuDPFTRLNoise | SecureGaussianNoise
        std = self.noise_multiplier * self.max_grad_norm
        if self.secure_rng and self.sharded:
            # every rank draws its own rows' noise: stream HMAC(root, "noise/rank"), ahead
            self.noise = SecureGaussianNoise(
                std, stream=secure_stream, rank=self.ranks.rank, prefetch=True
            )
            self.noise.expect([sharding.local_tensor(p) for p in self.params])
        elif self.secure_rng:
            # rank 0 alone draws the noise: only there is it generated (ahead, in a thread)
            self.noise = SecureGaussianNoise(std, stream=secure_stream, prefetch=self.ranks.is_main)
            if self.ranks.is_main:
                self.noise.expect(self.params)
        else:
            self.noise = self.mechanism.sampler(std)

    def _resolve_layer_methods(self) -> dict[str, str]:
        by_name, by_id = resolve_layer_methods(
            self.hooks, self.norm_method, self.k, self.max_seq_len
        )
        self.hooks.plan = by_id
        return by_name

    def _fingerprint(self) -> str:
        """What every rank's engine must agree on (not the parameters' values)."""
        return (
            f"{parameter_fingerprint(self.params)}|C={self.max_grad_norm!r}|"
            f"sigma={self.noise_multiplier!r}|qN={self.expected_batch_size!r}|"
            f"{sorted(self.layer_methods.items())}|k={self.k}|{self.clipped_sum}|"
            f"{self.noise_mechanism}|seed={self.seed}|sketch={self.sketch}"
        )

    # ------------------------------------------------------------------ public API
    # -- the mechanism's settings, read from the objects
    @property
    def norm_method(self) -> str:
        """The norm method's name (how per-sample norms are computed)."""
        return self.clipping.norm_method

    @property
    def k(self) -> int:
        return self.clipping.k

    @property
    def sketch(self) -> str:
        """How the projections are drawn: ``"per_example"`` or ``"shared"`` (exact norms)."""
        return self.clipping.sketch

    @property
    def max_seq_len(self) -> int | None:
        return self.clipping.max_seq_len

    @property
    def clipped_sum(self) -> str:
        """How the clipped sum is formed: ``"bookkeeping"`` or ``"two_pass"``."""
        return self.clipping.clipped_sum

    @property
    def check_independence(self) -> bool:
        return self.clipping.check_independence

    @property
    def noise_mechanism(self) -> str:
        """The noise mechanism's name: ``"gaussian"`` or ``"nu_dpftrl"``."""
        return self.mechanism.name

    @property
    def secure_rng(self) -> bool:
        """Whether the noise comes from the ChaCha20 keystream (secure mode)."""
        return self.mechanism.secure

    @property
    def randomized(self) -> bool:
        """Whether any parameter's norm is a randomized estimate (for the accountant)."""
        return any(get_norm_method(m).randomized for m in self.layer_methods.values())

    @property
    def accounting_envelope(self) -> str:
        """The accountant's envelope family (its ``clipping`` argument) that covers this
        engine's mechanism.

        From the resolved layer methods: ``"exact"`` when no parameter uses a sketch (``auto``
        with every layer exact included), ``"hutchpp"`` for Hutch++, else ``"hutch"``. A mix
        of exact and Hutchinson layers is covered by the dimension-free envelope
        (docs/design.md §4).
        """
        return accounting_envelope_for(self.layer_methods)

    @property
    def accounting_sketch(self) -> str:
        """The accountant's ``sketch``: ``"per_example"`` when per-example projections are
        drawn and some parameter is sketched; else ``"shared"`` (exact plans included)."""
        if self.sketch == PER_EXAMPLE_SKETCH and self.accounting_envelope != "exact":
            return PER_EXAMPLE_SKETCH
        return SHARED_SKETCH

    def privacy_event(
        self,
        steps: int,
        sample_rate: float | None = None,
        *,
        min_separation: int | None = None,
    ) -> PrivacyEvent:
        """The privacy event of ``steps`` steps of this engine.

        Gaussian noise: ``sample_rate`` q (the Poisson rate, expected_batch_size / N: the
        engine does not know N) is required; the event carries σ, the accounting envelope, k
        and the sketch the engine draws. ν-DP-FTRL: ``min_separation`` (the steps of one
        fixed-order epoch, ⌈N / B⌉) is required and the event is the first ``steps`` steps of
        the run (:meth:`NuDPFTRLEvent.prefix`); ``sample_rate`` is not used (no
        amplification by sampling is claimed). σ = 0 has no event (nothing is private)."""
        if self.noise_multiplier == 0:
            raise ValueError("noise_multiplier=0 is not private: there is no privacy event")
        if self.mechanism.sampling == "fixed_order":
            if min_separation is None:
                raise ValueError(
                    f"a {self.mechanism.name} engine's privacy_event needs min_separation (the "
                    "steps of one fixed-order epoch)"
                )
        elif min_separation is not None:
            raise ValueError("min_separation applies to fixed-order (nu_dpftrl) noise only")
        elif sample_rate is None:
            raise ValueError("privacy_event needs sample_rate (expected_batch_size / N)")
        return _event(
            self.mechanism,
            steps,
            sample_rate=sample_rate,
            envelope=self.accounting_envelope,
            k=self.k,
            sketch=self.accounting_sketch,
            min_separation=min_separation,
        )

    # -- deprecated names
    @property
    def clipping_mode(self) -> str:
        """Deprecated name of :attr:`clipped_sum`."""
        _deprecated_name("clipping_mode", "clipped_sum")
        return self.clipped_sum

    @property
    def norm_plan(self) -> dict[str, str]:
        """Deprecated name of :attr:`layer_methods`."""
        _deprecated_name("norm_plan", "layer_methods")
        return self.layer_methods

    @property
    def accounting_clipping(self) -> str:
        """Deprecated name of :attr:`accounting_envelope`."""
        _deprecated_name("accounting_clipping", "accounting_envelope")
        return self.accounting_envelope

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue exactly: step count and the generators' states
        (projections and noise). PRIVATE: the noise generator's state reveals the noise, so it
        must never be released with a model."""
        return {
            "steps": self.steps,
            "seed": self.seed,
            "generators": {k: g.get_state() for k, g in self.generators._by_device.items()},
            "noise": self.noise.state_dict(),
            "projections": (
                {}
                if self._projection_stream is None
                else {"key": self._projection_stream.state_dict()["key"]}
            ),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.seed = int(state["seed"])
        self.generators = _Generators(self.seed, self.generators.purpose)  # sharded: per rank
        for device, gen_state in state["generators"].items():
            self.generators(device).set_state(gen_state.cpu())
        self.noise.load_state_dict(state.get("noise", {}))
        key = (state.get("projections") or {}).get("key")
        if (key is None) != (self._projection_stream is None):
            raise ValueError(
                "the state's per-example projection key does not match this engine's mode "
                f"(sketch={self.sketch!r}, secure_rng={self.secure_rng})"
            )
        if key is not None:
            self._projection_stream = SecureStream(
                bytes(torch.as_tensor(key, dtype=torch.uint8).tolist())
            )

    def accumulate(
        self, loss_fn: LossFn, batch: Any, example_ids: Any = None, user_ids: Any = None
    ) -> None:
        """Add one micro-batch's clipped per-sample gradients to the logical batch.

        ``example_ids`` (per-example sketches): each sample's index in the data set, distinct
        within the logical batch; an example's projections are keyed by it, so a batch gives
        the same norms however it is split into micro-batches or ranks. Without ids a sample
        is keyed by its position in the logical batch on this rank.

        ``user_ids`` (user-level DP, docs/privacy_unit.md): the user each row belongs to. The
        privacy unit is then the user: each user's gradient — the sum over its rows in this
        micro-batch — is clipped to ``max_grad_norm`` as one sample (exact or sketched norms;
        per-example sketches are keyed by the user id), and a user's rows must all be in one
        micro-batch of the logical batch (a user met again is refused: it would be clipped
        twice; with several ranks, on one rank too: :meth:`step` refuses a user, or an example
        id, that two ranks met). ``expected_batch_size`` is then the expected number of users
        per step.

        Stages: open the logical batch; check sample independence (once); the norm pass;
        drop non-finite samples; the clipped sum; the batch's statistics."""
        self._open_batch()
        size = batch_size(batch)
        if size == 0:
            if self.sharded:
                raise ValueError(
                    "an empty micro-batch with a sharded (FSDP2) model: every rank must run "
                    "as many forward/backward passes as the others (FSDP all-gathers the "
                    "parameters in each); call pad(loss_fn, batch) with any non-empty batch "
                    "instead — it runs the passes and contributes nothing"
                )
            return  # an empty (Poisson) micro-batch contributes nothing
        if user_ids is None:
            self._check_unit("example")
            self._accumulate(loss_fn, batch, size, self._example_ids(example_ids, size))
            return
        if example_ids is not None:
            raise ValueError(
                "pass user_ids or example_ids, not both: under user-level DP a user's "
                "projections are keyed by the user"
            )
        self._check_unit("user")
        groups = self._user_groups(user_ids, size)
        keys = list(groups.keys) if self.sketch == PER_EXAMPLE_SKETCH else None
        self._accumulate(loss_fn, batch, size, keys, groups)

    def pad(self, loss_fn: LossFn, batch: Any) -> None:
        """Sharded (FSDP2) models: run ``batch``'s forward and norm backward for FSDP's
        collectives and discard everything it computes (no norm, no contribution, no
        statistic, no example id recorded). Every rank must call :meth:`accumulate` or
        :meth:`pad` the same number of times in a logical batch — the same forward/backward
        passes — so a rank with fewer micro-batches (or none: Poisson sampling) pads with any
        non-empty batch of data. Unsharded models need no padding: a no-op."""
        if not self.sharded:
            return
        size = batch_size(batch)
        if not size:
            raise ValueError("pad() needs a non-empty batch (its rows are discarded)")
        self._open_batch()
        self._check_independence_once(loss_fn, batch, size)
        # per-example sketches: the rows keyed by their position (valid keys in secure mode
        # too); no id is recorded as met, and what the projections give is discarded
        ids = list(range(size)) if self.sketch == PER_EXAMPLE_SKETCH else None
        losses, _ = self._norm_pass(loss_fn, batch, ids)
        del losses
        # the micro-batch's reduction to the shards, which the others run too: zeros from here
        sharding.reduce_into_shards(
            lambda i: sharding.full_zeros(self.params[i]),
            self._layouts,
            self.ranks,
            self._shard_sums,
        )

    def _accumulate(
        self,
        loss_fn: LossFn,
        batch: Any,
        size: int | None,
        ids: list[int] | None,
        groups: UnitGroups | None = None,
    ) -> None:
        self._check_independence_once(loss_fn, batch, size)
        losses, result = self._norm_pass(loss_fn, batch, ids, groups)
        norms = result.sq_norms.clamp(min=0).sqrt()
        keep = self._kept_samples(norms, result, groups)
        if self.clipped_sum == "two_pass" and not bool(keep.all()):
            del losses
            self._rerun_kept(loss_fn, batch, size, norms, keep, ids, groups)
            return
        clip = torch.where(keep, (self.max_grad_norm / norms).clamp(max=1.0), 0.0)
        self._add_clipped_sum(losses, result, clip, keep, groups)
        self._record(norms, result, clip, keep, groups)

    # -- the stages of accumulate
    def _open_batch(self) -> None:
        if not self._in_batch:
            for p in self.params:
                p.grad = None
            self._in_batch = True

    def _check_independence_once(self, loss_fn: LossFn, batch: Any, size: int | None) -> None:
        if not self.check_independence or self._independence_checked:
            return
        if self.sharded:
            # the check's passes are collectives and its control flow depends on the data: all
            # ranks check the same two samples, the first rank's that has two
            sizes = torch.zeros(self.ranks.world_size, dtype=torch.float64)
            sizes[self.ranks.rank] = float(size or 0)
            all_reduce_sum([sizes], self.ranks)
            able = [r for r, n in enumerate(sizes.tolist()) if n >= 2]
            if not able:
                return
            pair = select_samples(batch, torch.arange(2)) if self.ranks.rank == able[0] else None
            pair = broadcast_object(pair, self.ranks, able[0])
            check_sample_independence(self.hooks, loss_fn, pair, self.norm_method, self.k)
            self._independence_checked = True
            return
        if (size or 0) >= 2:
            check_sample_independence(self.hooks, loss_fn, batch, self.norm_method, self.k)
            self._independence_checked = True

    def _check_unit(self, unit: str) -> None:
        """One privacy unit per logical batch: rows with user ids, or examples without."""
        if self._unit is not None and self._unit != unit:
            raise ValueError(
                "this logical batch mixes micro-batches with and without user_ids: pass "
                "user_ids with every micro-batch of a user-level step, or with none"
            )
        self._unit = unit

    def _user_groups(self, user_ids: Any, size: int | None) -> UnitGroups:
        """The micro-batch's rows grouped by user; a user already met in this logical batch
        is refused (its rows would be clipped as two samples)."""
        groups = group_rows(user_ids)
        if size is not None and groups.rows != size:
            raise ValueError(f"user_ids has {groups.rows} entries for a batch of {size} rows")
        repeated = self._ids_seen.intersection(groups.keys)
        if repeated:
            raise ValueError(
                f"user(s) {sorted(repeated)[:5]} already contributed to this logical batch: a "
                "user's rows must all be in one micro-batch (one clipping decision per user)"
            )
        self._ids_seen.update(groups.keys)
        return groups

    def _example_ids(self, example_ids: Any, size: int | None) -> list[int] | None:
        """The micro-batch's example keys for per-example sketches (None: shared sketch)."""
        if self.sketch != PER_EXAMPLE_SKETCH:
            return None
        n = int(size or 0)
        if example_ids is None:  # positions in the logical batch, distinct across ranks
            first = self._positions
            self._positions += n
            ids = [self.ranks.rank + self.ranks.world_size * (first + i) for i in range(n)]
            return [(1 << 62) + i for i in ids]  # never equal to a data set index
        ids = [int(i) for i in torch.as_tensor(example_ids).reshape(-1).tolist()]
        if len(ids) != n:
            raise ValueError(f"example_ids has {len(ids)} entries for a batch of {n} samples")
        if any(i < 0 or i >= 1 << 62 for i in ids):
            raise ValueError("example_ids must be data set indices in [0, 2**62)")
        repeated = self._ids_seen.intersection(ids)
        if repeated or len(set(ids)) != len(ids):
            raise ValueError(
                "example_ids repeat within the logical batch "
                f"({sorted(repeated)[:5] or 'within this micro-batch'}): an example's "
                "per-example projection would be used twice"
            )
        self._ids_seen.update(ids)
        return ids

    def _norm_pass(
        self,
        loss_fn: LossFn,
        batch: Any,
        ids: list[int] | None = None,
        groups: UnitGroups | None = None,
    ) -> tuple[torch.Tensor, Any]:
        two_pass = self.clipped_sum == "two_pass"
        return self.hooks.norm_pass(
            loss_fn,
            batch,
            method=self.norm_method,
            k=self.k,
            generator_for=self._projections(ids),
            retain_graph=two_pass,
            keep_contributions=not two_pass,
            groups=groups,
        )

    def _projections(self, ids: list[int] | None = None) -> Callable[[torch.device, str], Any]:
        """The sketches' projections for this micro-batch. Shared: generators derived from
        (seed, step), fresh for each micro-batch, so every micro-batch and every rank of one
        step draws the same projections — one sketch per layer per logical batch, however the
        batch is split. Per example: keyed by (secret, step, parameter, example id)
        (dprc_core/sketches.py)."""
        if ids is None:
            return _Generators(self.seed, f"projections/{self.steps}")
        return per_example_source(self.seed, self.steps, ids, self._projection_stream)

    def _kept_samples(
        self, norms: torch.Tensor, result: Any, groups: UnitGroups | None = None
    ) -> torch.Tensor:
        """Samples (units) whose losses, norm and (book-keeping) gradient factors are all
        finite."""
        finite_losses = torch.isfinite(result.losses)
        if groups is not None:
            finite_losses = groups.all_rows(finite_losses)
        keep = torch.isfinite(norms) & finite_losses.to(norms.device)
        if self.clipped_sum != "two_pass":
            keep &= _finite_samples(result.contributions, keep)
        return keep

    def _rerun_kept(
        self,
        loss_fn: LossFn,
        batch: Any,
        size: int | None,
        norms: torch.Tensor,
        keep: torch.Tensor,
        ids: list[int] | None = None,
        groups: UnitGroups | None = None,
    ) -> None:
        """two_pass with non-finite samples: the retained graph holds their activations, and a
        backward through it would give 0 · NaN = NaN, so run the kept samples again on their
        own (a fresh forward, norm pass and clipped backward for exactly those samples)."""
        self._norms.append(norms.detach()[~keep])
        self._dropped += int((~keep).sum())
        if groups is not None:  # the kept users' rows, grouped again, keyed by the users
            rows = groups.rows_of(keep).cpu()
            if rows.numel():
                sub = groups.subset(rows)
                sub_ids = None if ids is None else list(sub.keys)
                batch = select_samples(batch, rows, size)
                self._accumulate(loss_fn, batch, rows.numel(), sub_ids, sub)
            return
        kept = torch.nonzero(keep).flatten().cpu()
        if kept.numel():
            # the same examples again, with the same keys (hence the same projections)
            kept_ids = None if ids is None else [ids[i] for i in kept.tolist()]
            self._accumulate(loss_fn, select_samples(batch, kept, size), kept.numel(), kept_ids)

    def _add_clipped_sum(
        self,
        losses: torch.Tensor,
        result: Any,
        clip: torch.Tensor,
        keep: torch.Tensor,
        groups: UnitGroups | None = None,
    ) -> None:
        if self.clipped_sum == "two_pass":
            if groups is not None:  # each row weighted by its user's factor
                clip = clip[groups.unit.to(clip.device)]
            weighted = (losses * clip.to(losses.dtype).detach()).sum()
            torch.autograd.backward(weighted, inputs=self.params)
        else:
            self._bookkeeping_sum(result.contributions, clip, keep)

    def _record(
        self,
        norms: torch.Tensor,
        result: Any,
        clip: torch.Tensor,
        keep: torch.Tensor,
        groups: UnitGroups | None = None,
    ) -> None:
        rows_kept = keep if groups is None else keep[groups.unit.to(keep.device)]
        self._norms.append(norms.detach())
        self._losses.append(result.losses.detach()[rows_kept.to(result.losses.device)])
        self._clipped += int(((clip < 1) & keep).sum())
        self._dropped += int((~keep).sum())
        self._methods.update(result.methods)

    def step(
        self,
        loss_fn: LossFn | None = None,
        batch: Any = None,
        example_ids: Any = None,
        user_ids: Any = None,
    ) -> StepStats:
        """Finish the logical batch: noise once, divide by the expected batch size, step."""
        if (loss_fn is None) != (batch is None):
            raise ValueError("pass both loss_fn and batch, or neither (after accumulate())")
        if loss_fn is not None:
            self.accumulate(loss_fn, batch, example_ids, user_ids)
        self._check_units_across_ranks()
        if not self._in_batch:  # an empty logical batch: still a (noise-only) step
            for p in self.params:
                p.grad = None
        self._add_noise_and_normalise()
        before = self._fingerprints()
        self.optimizer.step()
        self._check_update(before)
        self.steps += 1
        stats = self._step_stats()
        self._reset_batch()
        return stats

    def _check_units_across_ranks(self) -> None:
        """Several ranks (data-parallel or sharded): the units met in this logical batch — the
        user ids, or the example ids passed to :meth:`accumulate` — are gathered from every
        rank (their int64 ids), and a unit met on two ranks is refused on every rank, the batch
        dropped and no step taken: each rank would clip its rows of the unit as one sample, so
        the unit would contribute up to C once per rank. The ranks must also agree on the
        batch's privacy unit (users, or examples)."""
        if not self.ranks.distributed:
            return
        code = {None: 0, "example": 1, "user": 2}[self._unit]
        parts = all_gather_ints([code, *sorted(self._ids_seen)], self.ranks)
        units = {part[0] for part in parts if part[0]}
        if len(units) > 1:
            self._drop_batch()
            raise ValueError(
                "the ranks disagree on this logical batch's privacy unit: some passed user_ids, "
                "others not; pass user_ids on every rank of a user-level step, or on none"
            )
        owner: dict[int, int] = {}
        twice: dict[int, list[int]] = {}
        for rank, part in enumerate(parts):
            for unit_id in part[1:]:
                if unit_id in owner:
                    twice.setdefault(unit_id, [owner[unit_id]]).append(rank)
                else:
                    owner[unit_id] = rank
        if not twice:
            return
        self._drop_batch()
        shown = ", ".join(f"{i} (ranks {ranks})" for i, ranks in sorted(twice.items())[:5])
        if units == {2}:
            raise ValueError(
                f"user(s) {shown} contributed to this logical batch on two ranks: a user's "
                "rows must all be on one rank, in one micro-batch (each rank clips its rows "
                "of the user as one sample, so the user would contribute up to C once per "
                "rank); split a step's users between the ranks, not their rows "
                "(UserPoissonSampler does)"
            )
        raise ValueError(
            f"example id(s) {shown} contributed to this logical batch on two ranks: each "
            "example must be on one rank (it would be clipped, and its per-example projection "
            "used, once per rank); split the batch's examples between the ranks "
            "(dprc_core.distributed.shard_indices)"
        )

    def _drop_batch(self) -> None:
        """Drop the logical batch being accumulated (no step is taken)."""
        for p in self.params:
            p.grad = None
        self._reset_batch()

    @torch.no_grad()
    def _fingerprints(self) -> list[torch.Tensor]:
        """(Σp, ‖p‖) accumulated in float64 for each trainable parameter the model has *now*:
        two reductions, no copy of the weights kept, and changed by any update short of one
        that cancels exactly in both."""
        local = [sharding.local_tensor(p) for p in trainable_parameters(self.model)]
        return [
            torch.stack(
                (p.sum(dtype=torch.float64), torch.linalg.vector_norm(p, dtype=torch.float64))
            )
            for p in local
        ]

    @torch.no_grad()
    def _check_update(self, before: list[torch.Tensor]) -> None:
        """After ``optimizer.step()``: when the learning rate is non-zero and the (noised)
        update is not zero, at least one trainable parameter of the model must have changed.

        A run whose weights never move while its loss and ε look normal is what happens when
        the model's parameters are replaced after the optimizer was built (Opacus #820: peft
        LoRA with ``.to(device)`` after the wrapping; also ``load_state_dict(assign=True)``):
        the optimizer then updates tensors the model no longer uses."""
        lr = [float(g.get("lr", 0.0)) for g in self.optimizer.param_groups if g["params"]]
        if not any(v != 0 for v in lr):
            return
        grads = [sharding.local_tensor(p.grad) for p in self.params if p.grad is not None]
        if not any(bool(g.any()) for g in grads):
            return  # σ = 0 and an empty (or all-zero) batch (or rows): nothing to move
        after = self._fingerprints()
        if len(after) == len(before) and not all(map(torch.equal, before, after)):
            return
        current = {id(p) for p in trainable_parameters(self.model)}
        stepped = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        why = (
            "the model's trainable parameters are not the tensors the optimizer holds: they "
            "were replaced after the optimizer and the engine were built (e.g. by .to(), "
            "get_peft_model or load_state_dict(assign=True)); build the optimizer and the "
            "engine from the model as it will train"
            if current != stepped
            else "the optimizer step left every parameter unchanged (learning rate too small "
            "for the parameters' precision?)"
        )
        raise RuntimeError(
            f"step {self.steps + 1}: no trainable parameter of the model changed although the "
            f"learning rate is {max(lr, key=abs):g} and the update is non-zero; {why}"
        )

    def _add_noise_and_normalise(self) -> None:
        """Noise once for the logical batch, then divide by the expected batch size; refuse to
        step on a non-finite update. Several ranks: rank 0 adds the one noise draw to its part,
        then the parts are SUM-reduced (every rank, an empty part included, joins). Sharded:
        :meth:`_add_noise_to_shards`."""
        if self.sharded:
            self._add_noise_to_shards()
            return
        with torch.no_grad():
            grads = []
            for index, p in enumerate(self.params):
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                if self.ranks.is_main:
                    noise = self.noise.sample(index, grad, self.generators(grad.device))
                    if noise is not None:
                        grad = grad + noise
                grads.append(grad)
            if self.ranks.is_main:
                self.noise.end_step()
            all_reduce_sum(grads, self.ranks)
            for p, grad in zip(self.params, grads, strict=True):
                p.grad = grad / self.expected_batch_size
            # every p.grad was assigned a tensor in the loop above
            if not all(bool(torch.isfinite(cast(torch.Tensor, p.grad)).all()) for p in self.params):
                self._refuse_non_finite_update()

    @torch.no_grad()
    def _add_noise_to_shards(self) -> None:
        """Sharded (FSDP2): each rank holds its rows of the batch's clipped sum (reduced after
        each micro-batch); it noises them once, from its own stream; divided by q·N they are the
        sharded parameters' gradients (:mod:`dprc_core.sharding`)."""
        shards = [
            self._shard_sums.pop(i)
            if i in self._shard_sums
            else torch.zeros_like(sharding.local_tensor(p))
            for i, p in enumerate(self.params)
        ]
        finite = True
        for index, (p, shard) in enumerate(zip(self.params, shards, strict=True)):
            noise = self.noise.sample(index, shard, self.generators(shard.device))
            if noise is not None:
                shard = shard + noise
            shard = shard / self.expected_batch_size
            finite = finite and bool(torch.isfinite(shard).all())
            p.grad = sharding.as_shard_grad(shard, p)
        self.noise.end_step()
        # every rank must agree whether to step (one rank's non-finite rows stop them all)
        flag = torch.tensor([0.0 if finite else 1.0], device=self._comm_device)
        all_reduce_sum([flag], self.ranks)
        if float(flag) > 0:
            self._refuse_non_finite_update()

    def _refuse_non_finite_update(self) -> None:
        """No step on a non-finite noised update: the gradients and the batch are dropped."""
        for p in self.params:
            p.grad = None
        self._reset_batch()
        raise FloatingPointError(
            "the noised update is not finite although every non-finite sample was "
            "dropped; the optimizer step was not taken"
        )

    def _step_stats(self) -> StepStats:
        """The logical batch's statistics; with several ranks the counts and the mean loss are
        the whole batch's (one small SUM reduction), ``per_sample_norms`` this rank's part."""
        norms = torch.cat(self._norms) if self._norms else torch.zeros(0)
        losses = torch.cat(self._losses) if self._losses else torch.zeros(0)
        counts = torch.tensor(
            [norms.shape[0], self._dropped, self._clipped, float(losses.double().sum())],
            dtype=torch.float64,
            device=self._comm_device,
        )
        all_reduce_sum([counts], self.ranks)
        n, dropped, clipped = (int(v) for v in counts[:3].tolist())
        kept = n - dropped
        return StepStats(
            step=self.steps,
            batch_size=n,
            per_sample_norms=norms,
            clipped_fraction=clipped / kept if kept else 0.0,
            mean_loss=float(counts[3]) / kept if kept else float("nan"),
            methods=dict(self._methods),
            dropped=dropped,
        )

    def detach(self) -> None:
        """Remove the hooks from the model (and stop secure mode's noise thread)."""
        self.hooks.remove()
        self.close()

    def close(self) -> None:
        """Stop secure mode's background noise generation (a no-op otherwise)."""
        if isinstance(self.noise, SecureGaussianNoise):
            self.noise.close()

    # ------------------------------------------------------------------ internals
    def _reset_batch(self) -> None:
        self._in_batch = False
        self._norms = []
        self._losses = []
        self._clipped = 0
        self._dropped = 0
        self._methods = {}
        self._ids_seen: set[int] = set()  # example ids, or user ids, met in this batch
        self._unit = None
        self._positions = 0
        self._shard_sums = {}  # sharded: this rank's rows of the batch's clipped sum

    def _check_optimizer(self) -> None:
        trainable = {id(p) for p in self.params}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in trainable:
                    raise ValueError(
                        "the optimizer holds a parameter that is not a trainable parameter of "
                        "the model; its update would not be privatized"
                    )

    @torch.no_grad()
    def _bookkeeping_sum(
        self, contributions: dict[int, list], clip: torch.Tensor, keep: torch.Tensor
    ) -> None:
        drop = not bool(keep.all())

        def clipped_sum(p: torch.Tensor) -> torch.Tensor | None:
            contribs = contributions.get(id(p))
            if not contribs:
                return None
            if drop:  # remove dropped samples entirely: 0 · NaN would still be NaN
                contribs = [_zero_samples(c, keep) for c in contribs]
            w = clip.to(p.dtype)
            total = sharding.full_zeros(p) if self.sharded else torch.zeros_like(p)
            for c in contribs:
                if isinstance(c, MatrixContribution):
                    total += c.weighted_sum(w.to(_dense_dtype(c))).to(p.dtype)
                else:  # per-sample gradients (B, *p.shape)
                    wc = w.to(c.dtype).reshape(-1, *([1] * (c.dim() - 1)))
                    total += (c * wc).sum(0).to(p.dtype)
            return total

        if self.sharded:  # formed a bucket at a time and reduced to this rank's rows at once

            def whole(i: int) -> torch.Tensor:
                total = clipped_sum(self.params[i])
                return total if total is not None else sharding.full_zeros(self.params[i])

            sharding.reduce_into_shards(whole, self._layouts, self.ranks, self._shard_sums)
            return
        for p in self.params:
            total = clipped_sum(p)
            if total is not None:
                p.grad = total if p.grad is None else p.grad + total


def resolve_layer_methods(
    hooks: PerSampleHooks, norm_method: str, k: int, max_seq_len: int | None
) -> tuple[dict[str, str], dict[int, str]]:
    """Parameter name -> the norm method it gets, fixed for an engine's life; and the same
    keyed by id(parameter) for the hooks (only for ``auto``, else empty: the hooks use the
    global method).

    1-D parameters are always exact. ``auto`` is resolved once per parameter, for
    ``max_seq_len`` tokens per use (tied parameters: one use per owning module), with the cost
    rule of :func:`dprc_core.estimators.auto_method`.
    """
    uses = hooks.uses_per_parameter()
    one_hot: dict[int, bool] = {}
    for h in hooks.hooked:
        for p in h.params.values():
            one_hot[id(p)] = one_hot.get(id(p), True) and h.handler.one_hot
    by_name: dict[str, str] = {}
    by_id: dict[int, str] = {}
    for pid, name in hooks.param_names.items():
        p = hooks.params[pid]
        if p.dim() == 1:
            by_name[name] = "exact"
        elif norm_method == "auto":
            if max_seq_len is None:
                raise ValueError("norm_method='auto' needs max_seq_len")
            r, c = p.shape
            t = uses.get(pid, 1) * max_seq_len
            method = auto_method(t, r, c, one_hot.get(pid, False), k)
            method = "exact" if method in ("fgc", "ghost") else method
            by_id[pid] = by_name[name] = method
        else:
            by_name[name] = norm_method
    return by_name, by_id


def accounting_envelope_for(methods: dict[str, str]) -> str:
    """The accountant's envelope family for resolved layer methods (see
    :attr:`PrivacyEngine.accounting_envelope`)."""
    return envelope_for(set(methods.values()))


def layer_methods(
    model: nn.Module,
    norm_method: str | NormChoice,
    k: int = DEFAULT_K,
    max_seq_len: int | None = None,
) -> dict[str, str]:
    """The layer methods a :class:`PrivacyEngine` would resolve for ``model`` (no hooks left
    behind): lets a caller know ``accounting_envelope_for(methods)`` — hence calibrate σ —
    before building the engine. ``norm_method``: a name (with ``k`` and ``max_seq_len``) or a
    norm object (``Exact()``, ``Hutch(k)``, ``Auto(max_seq_len, k)``, ...)."""
    if not isinstance(norm_method, str):
        norm = norm_method
        norm_method, k = norm.method, DEFAULT_K if isinstance(norm, Exact) else norm.k
        max_seq_len = norm.max_seq_len if isinstance(norm, Auto) else None
    _check_method(norm_method)
    check_k(k, randomized=get_norm_method(norm_method).randomized)
    hooks = PerSampleHooks(model)
    try:
        return resolve_layer_methods(hooks, norm_method, k, max_seq_len)[0]
    finally:
        hooks.remove()


def make_norm_plan(
    hooks: PerSampleHooks, norm_method: str, k: int, max_seq_len: int | None
) -> tuple[dict[str, str], dict[int, str]]:
    """Deprecated name of :func:`resolve_layer_methods`."""
    _deprecated_name("make_norm_plan", "resolve_layer_methods")
    return resolve_layer_methods(hooks, norm_method, k, max_seq_len)


def accounting_clipping_for(plan: dict[str, str]) -> str:
    """Deprecated name of :func:`accounting_envelope_for`."""
    _deprecated_name("accounting_clipping_for", "accounting_envelope_for")
    return accounting_envelope_for(plan)


def norm_plan(
    model: nn.Module, norm_method: str, k: int = DEFAULT_K, max_seq_len: int | None = None
) -> dict[str, str]:
    """Deprecated name of :func:`layer_methods`."""
    _deprecated_name("norm_plan", "layer_methods")
    return layer_methods(model, norm_method, k, max_seq_len)


def _deprecated_name(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)


# ---------------------------------------------------------------- the mechanism objects
# The deprecated keyword form of PrivacyEngine(...) and its defaults.
_KEYWORDS: dict[str, Any] = {
    "max_grad_norm": None,
    "noise_multiplier": None,
    "norm_method": "hutch",
    "k": DEFAULT_K,
    "clipping_mode": "bookkeeping",
    "max_seq_len": None,
    "check_independence": True,
    "noise_mechanism": "gaussian",
    "nu": None,
    "bands": None,
    "secure_rng": False,
    "sketch": None,
}


def _mechanism_objects(
    clipping: Clipping | None, noise: NoiseMechanism | None, deprecated: dict[str, Any]
) -> tuple[Clipping, NoiseMechanism]:
    """The engine's ``(clipping, noise)``: as given, or converted from the deprecated keyword
    form (one DeprecationWarning); the combination checked."""
    unknown = sorted(set(deprecated) - set(_KEYWORDS))
    if unknown:
        raise TypeError(f"PrivacyEngine() got an unexpected keyword argument {unknown[0]!r}")
    if deprecated:
        if clipping is not None or noise is not None:
            raise TypeError(
                "PrivacyEngine takes clipping= and noise= or the deprecated keywords "
                f"({', '.join(sorted(deprecated))}), not both"
            )
        warnings.warn(
            "PrivacyEngine(max_grad_norm=, noise_multiplier=, norm_method=, ...) is "
            "deprecated; pass clipping=dprc_core.clipping.Clipping(C, Exact() | Hutch(k) | "
            "HutchPP(k) | Auto(max_seq_len)) and noise=dprc_core.noise.Gaussian(σ) | "
            "NuDPFTRL(σ, nu, bands)",
            DeprecationWarning,
            stacklevel=3,
        )
        clipping, noise = _from_keywords({**_KEYWORDS, **deprecated})
    if not isinstance(clipping, Clipping):
        raise TypeError(f"PrivacyEngine needs clipping=Clipping(...), got {clipping!r}")
    if not isinstance(noise, NoiseMechanism):
        raise TypeError(
            f"PrivacyEngine needs noise=Gaussian(σ) or NuDPFTRL(σ, nu, bands), got {noise!r}"
        )
    if noise.noise_multiplier is None:
        raise ValueError(f"noise={noise!r} needs its noise_multiplier σ")
    if noise.exact_clipping_only and clipping.randomized:
        raise ValueError(
            f"norm_method={clipping.norm_method!r} with correlated noise ({noise.name}) is "
            "refused: randomized clipping with correlated noise has no privacy analysis; "
            "use an exact method (exact, ghost, fgc)"
        )
    return clipping, noise


def _from_keywords(kw: dict[str, Any]) -> tuple[Clipping, NoiseMechanism]:
    """The objects that the deprecated keywords describe (the same checks and messages)."""
    for required in ("max_grad_norm", "noise_multiplier"):
        if kw[required] is None:
            raise TypeError(f"PrivacyEngine() missing required keyword argument: {required!r}")
    if kw["clipping_mode"] not in CLIPPED_SUMS:
        raise ValueError(
            f"clipping_mode must be one of {CLIPPED_SUMS}, got {kw['clipping_mode']!r}"
        )
    sigma = check_noise_multiplier(kw["noise_multiplier"])
    norm = norm_from_method(
        kw["norm_method"], k=kw["k"], max_seq_len=kw["max_seq_len"], sketch=kw["sketch"]
    )
    clipping = Clipping(kw["max_grad_norm"], norm, kw["clipping_mode"], kw["check_independence"])
    mechanism = as_noise_mechanism(kw["noise_mechanism"], kw["nu"], kw["bands"], warn=False)
    if mechanism.noise_multiplier is not None:
        raise ValueError(
            "noise_mechanism= takes a mechanism without its noise_multiplier (given as "
            "noise_multiplier=); or pass noise= with clipping= instead of the keywords"
        )
    if kw["secure_rng"] and not mechanism.secure_capable:
        raise ValueError(
            f"secure_rng=True covers the Gaussian mechanism only, not {mechanism.name!r}: "
            "its noise would come from torch's generator"
        )
    return clipping, mechanism.with_sigma(sigma).with_secure(bool(kw["secure_rng"]))


def _sigma(noise: NoiseMechanism) -> float:
    sigma = noise.noise_multiplier
    assert sigma is not None  # _mechanism_objects refuses a mechanism without σ
    return sigma


def _event(
    mechanism: NoiseMechanism,
    steps: int,
    *,
    sample_rate: float | None,
    envelope: str,
    k: int,
    sketch: str,
    min_separation: int | None,
) -> PrivacyEvent:
    """The one place an engine's privacy event is built."""
    randomized = envelope != "exact"
    schedule = Schedule(
        _sigma(mechanism),
        steps,
        sample_rate=sample_rate if sample_rate is not None else 1.0,
        clipping=envelope,
        k=k if randomized else None,
        sketch=sketch,
        min_separation=min_separation,
    )
    return mechanism.event(schedule, steps)


def _finite_samples(contributions: dict[int, list], keep: torch.Tensor) -> torch.Tensor:
    """Per-sample: every factor / per-sample gradient row of the sample is finite."""
    ok = torch.ones_like(keep)
    for contribs in contributions.values():
        for c in contribs:
            factors = (c.left, c.right) if isinstance(c, MatrixContribution) else (c,)
            for f in factors:
                if isinstance(f, torch.Tensor):
                    ok &= torch.isfinite(f).flatten(1).all(1).to(ok.device)
    return ok


def _zero_samples(c: Any, keep: torch.Tensor) -> Any:
    def zero(f):
        if not isinstance(f, torch.Tensor):
            return f  # one-hot indices: always finite
        mask = keep.to(f.device).reshape(-1, *([1] * (f.dim() - 1)))
        return torch.where(mask, f, torch.zeros((), dtype=f.dtype, device=f.device))

    if isinstance(c, MatrixContribution):
        return MatrixContribution(zero(c.left), zero(c.right))
    return zero(c)


def _dense_dtype(c: MatrixContribution) -> torch.dtype:
    """The dtype a contribution's clipped sum is formed in: its dense factors' promoted one
    (under autocast they can differ, e.g. bf16 activations and fp32 output gradients)."""
    dense = [f.dtype for f in (c.left, c.right) if isinstance(f, torch.Tensor)]
    if not dense:
        raise AssertionError("a contribution has at least one dense factor")
    out = dense[0]
    for d in dense[1:]:
        out = torch.promote_types(out, d)
    return out
