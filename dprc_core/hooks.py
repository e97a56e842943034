"""Forward/backward hooks that turn a model's (activation, output-gradient) pairs into
per-sample squared gradient norms, one parameter at a time.

How the norm pass works
-----------------------
During the forward, every module that owns trainable parameters is hooked: its handler saves
what it needs (activations, token ids, inputs of a norm layer), and the module's output gets a
zero scalar *probe* added to it. The norm pass then differentiates the summed per-sample losses
with respect to the probes only, so autograd computes output gradients ``G`` for every hooked
module but no parameter gradient at all. A tensor hook on each output receives ``G``, the
handler turns it into per-sample contributions, and as soon as all uses of a parameter (tied
weights have several) have arrived, its per-sample squared norm is computed and the factors
are dropped (unless book-keeping keeps them for the clipped sum).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from dprc_core.batching import batch_size
from dprc_core.estimators import MatrixContribution, ProjectionSource, vector_sq_norms
from dprc_core.layers import LayerHandler, UnsupportedModuleError, handler_for, supported_types
from dprc_core.layers.base import Contribution, handler_for_type, overriding_class
from dprc_core.layers.unsupported import known_unsupported
from dprc_core.norm_methods import matrix_sq_norms
from dprc_core.privacy_units import UnitGroups, group_contribution


@dataclass
class _HookedModule:
    name: str
    module: nn.Module
    handler: LayerHandler[Any]
    params: dict[str, nn.Parameter]  # attribute name -> trainable parameter owned directly


@dataclass
class _Call:
    hooked: _HookedModule
    saved: Any
    node: Any = None  # the autograd node of the probed output (reachability from the loss)


@dataclass
class NormPassResult:
    losses: torch.Tensor  # (B,), detached
    sq_norms: torch.Tensor  # (B,) estimated squared norms of the whole per-sample gradient
    methods: dict[str, str]  # parameter name -> method used
    # id(parameter) -> its contributions (kept for book-keeping only)
    contributions: dict[int, list[Contribution]] = field(default_factory=dict)
    # with record_layouts: (module, layout, output shape, per-sample shape) per hooked call,
    # in call order; layout is batch | flattened | shared
    layouts: list[tuple[str, str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    # with record_layouts: parameter name -> (B,) per-sample squared norm of that parameter
    per_parameter: dict[str, torch.Tensor] = field(default_factory=dict)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms of half-precision layers are computed in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for p in model.parameters():
        if p.requires_grad:
            seen.setdefault(id(p), p)
    return list(seen.values())


class PerSampleHooks:
    """Hooks on every module of ``model`` that owns trainable parameters."""

    def __init__(self, model: nn.Module, verified_layouts: bool = False):
        self.model = model
        # accept layouts that are not plainly batch-first — batch-major flattened (B·T, d)
        # outputs and outputs shared by the batch (leading dimension 1) — only when the
        # caller runs the per-sample independence check, which verifies them
        self.verified_layouts = verified_layouts
        self.param_names: dict[int, str] = {}  # id(parameter) -> first qualified name
        self.params: dict[int, nn.Parameter] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            if p.requires_grad and id(p) not in self.param_names:
                self.param_names[id(p)] = name
                self.params[id(p)] = p
        if not self.param_names:
            raise ValueError("the model has no trainable parameters (requires_grad=True)")
        _refuse_functional_parents(model)
        refuse_activation_checkpointing(model)
        self.hooked = _hook_targets(model)
        self._handles: list[Any] = []
        self._state: _PassState | None = None
        self.plan: dict[int, str] = {}  # id(parameter) -> fixed norm method (engine's auto plan)
        self._attach()

    def uses_per_parameter(self) -> dict[int, int]:
        """How many hooked modules own each trainable parameter (tied weights: several)."""
        count: dict[int, int] = {}
        seen: set[int] = set()
        for h in self.hooked:
            if id(h.module) in seen:
                continue
            seen.add(id(h.module))
            for p in h.params.values():
                count[id(p)] = count.get(id(p), 0) + 1
        return count

    # ----------------------------------------------------------------------------- hooks
    def _attach(self) -> None:
        seen: set[int] = set()
        for h in self.hooked:
            if id(h.module) in seen:  # a module registered under two names: hook once
                continue
            seen.add(id(h.module))
            self._handles.append(
                h.module.register_forward_hook(self._forward_hook(h), with_kwargs=True)
            )

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _forward_hook(self, hooked: _HookedModule) -> Callable:
        def hook(module, args, kwargs, output):
            state = self._state
            if state is None or not state.recording:
                return None
            if not isinstance(output, torch.Tensor):
                raise UnsupportedModuleError(
                    f"module '{hooked.name}' returned {type(output).__name__}, expected a tensor"
                )
            output, args, layout = self._read_layout(hooked, output, args, state)
            if hooked.handler.capture_kwargs:
                # capture_kwargs=True: this handler's capture takes the kwargs as a 4th argument
                saved = hooked.handler.capture(module, args, output, kwargs)  # type: ignore[call-arg]
            else:
                saved = hooked.handler.capture(module, args, output)
            call = _Call(hooked, saved)
            probe = torch.zeros((), dtype=output.dtype, device=output.device, requires_grad=True)
            state.probes.append(probe)
            # Add the probe in place where that is allowed: a copy of every output (logits
            # included) costs time and fragments the allocator. An in-place conflict with a
            # saved tensor would raise at backward time, never pass silently.
            out = output + probe if layout == "shared" or output._is_view() else output.add_(probe)
            call.node = out.grad_fn
            state.calls.append(call)
            out.register_hook(_GradHook(state, len(state.calls) - 1))
            return out

        return hook

    def _read_layout(
        self, hooked: _HookedModule, output: torch.Tensor, args: tuple, state: _PassState
    ) -> tuple[torch.Tensor, tuple, str]:
        """How a call's leading dimension maps to the batch: ``batch``, ``shared`` (expanded
        to the batch) or ``flattened`` (inputs viewed as (B, T, ...)); refuses a call that ran
        without autograd. Recorded for the independence check when it asks."""
        if not output.requires_grad:
            raise UnsupportedModuleError(
                f"module '{hooked.name}' ran without autograd (under torch.no_grad, or "
                "inside a reentrant torch.utils.checkpoint, which recomputes it in the "
                "backward where the per-sample hooks cannot see it): its per-sample "
                "gradient cannot be computed; use torch.utils.checkpoint(..., "
                "use_reentrant=False) or no checkpointing, or freeze the module"
            )
        b = state.expected_batch
        layout = "batch"
        if b is not None and b != 1 and output.dim() > 0 and output.shape[0] == 1:
            # Shared by the batch (e.g. position embeddings of shape (1, T, d)): give each
            # sample its own copy so that each gets its own output gradient. Only correct if
            # the model then broadcasts it against the batch; the independence check verifies
            # that (per parameter, against each sample alone).
            if not self.verified_layouts:
                raise UnsupportedModuleError(
                    f"module '{hooked.name}' returned an output of shape "
                    f"{tuple(output.shape)} shared by the batch of {b}; its per-sample "
                    "gradients are computed only under the per-sample independence check "
                    "(check_independence=True, the default), which verifies them"
                )
            output = output.expand(b, *output.shape[1:])
            args = tuple(_expand_batch(a, b) for a in args)
            layout = "shared"
            state.shared.append(hooked.name)
        elif (
            self.verified_layouts
            and b
            and output.dim() >= 2
            and (output.shape[0] != b and output.shape[0] % b == 0)
        ):
            # A batch-major flattened layout (B·T, d), as OPT's MLP uses: view the inputs as
            # (B, T, ...). Any other layout read this way (sequence-major, no batch dimension
            # at all) is refused by the independence check.
            args = tuple(_unflatten_batch(a, b, output.shape[0]) for a in args)
            layout = "flattened"
        if state.layouts is not None:
            shape = tuple(output.shape)
            # the "flattened" layout is read only with a batch size b (the elif above)
            per_sample = (
                shape[1:] if layout != "flattened" else (shape[0] // cast(int, b), *shape[1:])
            )
            state.layouts.append((hooked.name, layout, shape, tuple(per_sample)))
        return output, args, layout

    # ----------------------------------------------------------------------------- pass
    def norm_pass(
        self,
        loss_fn: Callable[[nn.Module, Any], torch.Tensor],
        batch: Any,
        *,
        method: str,
        k: int,
        generator_for: Callable[[torch.device, str], ProjectionSource],
        retain_graph: bool,
        keep_contributions: bool,
        record_layouts: bool = False,
        groups: UnitGroups | None = None,
    ) -> tuple[torch.Tensor, NormPassResult]:
        """Run forward + norm backward. Returns (graph-attached losses, result).

        ``generator_for(device, parameter name)``: where a sketched parameter's projections come
        from (a generator shared by the batch, or per-example draws; dprc_core/sketches.py).
        ``record_layouts``: also return each hooked call's layout and every parameter's own
        per-sample squared norm (for the independence check). ``groups``: the rows' privacy
        units (user-level DP, :mod:`dprc_core.privacy_units`): norms and kept contributions
        are then per unit, (U,), the losses still per row."""
        refuse_activation_checkpointing(self.model)
        state = _PassState(self, method, k, generator_for, keep_contributions, groups)
        state.expected_batch = batch_size(batch)
        if record_layouts:
            state.layouts = []
            state.per_parameter = {}
        self._state = state
        try:
            try:
                losses = loss_fn(self.model, batch)
            except UnsupportedModuleError:
                raise
            except Exception as exc:
                if not state.shared:
                    raise
                raise UnsupportedModuleError(
                    f"the forward failed after dprc gave each sample its own copy of the "
                    f"output that module(s) {sorted(set(state.shared))} share across the "
                    f"batch ({type(exc).__name__}: {exc}). The model reshapes or repeats that "
                    "output itself, so those modules' per-sample gradients cannot be "
                    "computed: freeze them with requires_grad_(False)"
                ) from exc
            state.recording = False
            check_per_sample_losses(losses, expected=state.expected_batch)
            state.batch_size = losses.shape[0]
            if not state.probes:
                raise RuntimeError(
                    "no hooked module ran in the forward: does loss_fn call the model?"
                )
            if not losses.requires_grad:
                raise ValueError("the per-sample losses do not depend on trainable parameters")
            self._check_all_uses_hooked(losses, state)
            torch.autograd.grad(
                losses.sum(), state.probes, retain_graph=retain_graph, allow_unused=True
            )
            state.finish()
        finally:
            state.recording = False
            state.collecting = False
            self._state = None
        assert state.total is not None  # state.finish() sets it
        result = NormPassResult(
            losses=losses.detach(),
            sq_norms=state.total,
            methods=state.methods,
            contributions=state.kept,
            layouts=state.layouts or [],
            per_parameter=state.per_parameter or {},
        )
        return losses, result

    def _check_all_uses_hooked(self, losses: torch.Tensor, state: _PassState) -> None:
        """Refuse a parameter that reaches the loss other than through its hooked module (e.g.
        ``F.linear(h, embedding.weight)``): its per-sample gradient would be missed, and with
        two-pass clipping that part of the update would escape clipping altogether.

        Counts, in the autograd graph of the losses, the edges into each trainable parameter's
        gradient accumulator, against the hooked calls whose output reaches the losses (a call
        whose output is never used carries no gradient and hides nothing); every supported
        layer uses each of its parameters once per call. Calls that do not reach the losses
        are dropped from the pass, so each parameter's norm is finished as soon as its last
        gradient-carrying call has delivered its output gradient.
        """
        graph_uses: dict[int, int] = {}
        seen: set[int] = set()
        stack = [losses.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            for nxt, _ in node.next_functions:
                if nxt is None:
                    continue
                var = getattr(nxt, "variable", None)
                if var is not None:
                    graph_uses[id(var)] = graph_uses.get(id(var), 0) + 1
                elif id(nxt) not in seen:
                    stack.append(nxt)
        reached: dict[int, int] = {}
        for call in state.calls:
            if call.node is not None and id(call.node) in seen:
                for p in call.hooked.params.values():
                    reached[id(p)] = reached.get(id(p), 0) + 1
        for pid, n in graph_uses.items():
            if pid in self.params and n > reached.get(pid, 0):
                raise UnsupportedModuleError(
                    f"parameter '{self.param_names[pid]}' is used {n} time(s) in the forward but "
                    f"only {reached.get(pid, 0)} use(s) reaching the loss went through a "
                    "supported module; a functional use (e.g. F.linear(x, module.weight)) has "
                    "no per-sample gradient handler — route it through a module (e.g. an "
                    "nn.Linear sharing the weight)"
                )
        state.uses = reached


class _GradHook:
    """The tensor hook of one hooked call: hands the output gradient to the pass.

    It holds the pass only weakly. The autograd graph (C++ nodes, which Python's garbage
    collector cannot traverse) owns this hook, and the pass owns the graph through its calls'
    nodes and saved tensors; a strong reference here would make a cycle that is never freed,
    keeping every model a long-lived worker ever trained alive. A hook that fires after its
    pass is gone (the second backward of two-pass clipping, or a graph kept by the caller)
    does nothing."""

    __slots__ = ("_state", "_index")

    def __init__(self, state: _PassState, index: int) -> None:
        self._state = weakref.ref(state)
        self._index = index

    def __call__(self, g: torch.Tensor) -> None:
        state = self._state()
        if state is not None:
            state.on_grad(state.calls[self._index], g)


class _PassState:
    """Book-keeping for one forward/backward norm pass."""

    def __init__(
        self,
        hooks: PerSampleHooks,
        method,
        k,
        generator_for,
        keep: bool,
        groups: UnitGroups | None = None,
    ):
        self.hooks = hooks
        self.groups = groups
        self.method = method
        self.k = k
        self.generator_for = generator_for
        self.keep = keep
        self.recording = True
        self.collecting = True
        self.batch_size: int | None = None
        self.expected_batch: int | None = None
        self.probes: list[torch.Tensor] = []
        self.calls: list[_Call] = []
        self.shared: list[str] = []  # modules whose batch-shared output was given per sample
        self.layouts: list | None = None
        self.per_parameter: dict[str, torch.Tensor] | None = None
        self.uses: dict[int, int] = {}  # keyed by id(parameter): calls that reach the loss
        self.pending: dict[int, list[Contribution]] = {}
        self.kept: dict[int, list[Contribution]] = {}
        self.total: torch.Tensor | None = None
        self.methods: dict[str, str] = {}

    def on_grad(self, call: _Call, g: torch.Tensor) -> None:
        if not self.collecting:
            return  # e.g. the second backward of two-pass clipping
        hooked = call.hooked
        b = self.batch_size
        flat = self.hooks.verified_layouts and g.dim() >= 2 and g.shape[0] % (b or 1) == 0
        if b and flat and g.shape[0] != b:
            g = g.reshape(b, -1, g.shape[-1])  # batch-major flattened (B·T, d), see the hook
        if g.shape[0] != self.batch_size:
            raise ValueError(
                f"module '{hooked.name}' output has leading dimension {g.shape[0]} but the loss "
                f"has {self.batch_size} samples; dprc needs batch-first inputs (a batch-major "
                "flattened (B·T, d) layout is accepted only under the per-sample independence "
                "check, check_independence=True, which verifies that samples do not mix)"
            )
        g = g.reshape(g.shape[0], -1, g.shape[-1]) if g.dim() != 2 else g[:, None, :]
        contribs = hooked.handler.contributions(hooked.module, call.saved, g.detach())
        call.saved = None
        for pname, contrib in contribs.items():
            pid = id(hooked.params[pname])
            self.pending.setdefault(pid, []).append(contrib)
            if len(self.pending[pid]) == self.uses.get(pid, 0):
                self._finalize(pid)

    def _finalize(self, pid: int) -> None:
        contribs = self.pending.pop(pid)
        if self.groups is not None:  # one sample per privacy unit (the user's rows summed)
            contribs = [group_contribution(c, self.groups) for c in contribs]
        p = self.hooks.params[pid]
        dtype = compute_dtype(p.dtype)
        # a handler gives a 1-D parameter per-sample gradient tensors, a 2-D one
        # MatrixContributions (see Contribution)
        if p.dim() == 1:
            vectors = cast(list[torch.Tensor], contribs)
            sq = vector_sq_norms([c.to(dtype) for c in vectors])
            method = "exact"
        else:
            mats = cast(list[MatrixContribution], contribs)
            method = self.hooks.plan.get(pid, self.method)
            name = self.hooks.param_names[pid]
            sq, method = matrix_sq_norms(
                mats, method, k=self.k, generator=self.generator_for(p.device, name), dtype=dtype
            )
        self.methods[self.hooks.param_names[pid]] = method
        if self.per_parameter is not None:
            self.per_parameter[self.hooks.param_names[pid]] = sq.detach()
        self.total = sq if self.total is None else self.total + sq.to(self.total.dtype)
        if self.keep:
            self.kept[pid] = _compact(contribs, dtype)

    def finish(self) -> None:
        for pid in list(self.pending):  # a probe's gradient that autograd never delivered
            self._finalize(pid)
        if self.total is None:  # no hooked output reached the loss: all gradients are zero
            samples = self.groups.size if self.groups is not None else self.batch_size
            self.total = torch.zeros(samples or 0)
        for name in self.hooks.param_names.values():
            self.methods.setdefault(name, "unused")


def _hook_targets(model: nn.Module) -> list[_HookedModule]:
    """Every module that owns trainable parameters, with its verified handler; anything that
    cannot be handled is refused here, at construction, naming the module."""
    known = known_unsupported(model)
    handled = _parameters_of_handled_modules(model, known)
    targets: list[_HookedModule] = []
    for name, module in model.named_modules(remove_duplicate=False):
        params = {n: p for n, p in module.named_parameters(recurse=False) if p.requires_grad}
        if params and handler_for(module) is None and id(module) not in known:
            # an alias of a parameter a handled module owns too (BERT's MLM head holds the
            # decoder's tied bias as its own ``bias``): that module computes it
            params = {n: p for n, p in params.items() if id(p) not in handled}
        if not params:
            continue
        label = name or "<root>"
        if id(module) in known:
            raise UnsupportedModuleError(
                f"module '{label}' ({type(module).__name__}) has trainable parameters "
                f"{sorted(params)} but {known[id(module)]}, so their per-sample gradients "
                "cannot be computed; freeze them with requires_grad_(False)"
            )
        targets.append(
            _HookedModule(label, module, _checked_handler(label, module, params), params)
        )
    return targets


def _checked_handler(label: str, module: nn.Module, params: dict[str, nn.Parameter]):
    handler = handler_for(module)
    if handler is None:
        raise UnsupportedModuleError(_unsupported_message(label, module, params))
    try:
        handler.check(module)
    except UnsupportedModuleError as exc:  # a fallback that cannot verify the module
        raise UnsupportedModuleError(
            f"module '{label}' of type {type(module).__name__} {exc}"
        ) from exc
    except ValueError as exc:
        raise UnsupportedModuleError(f"module '{label}': {exc}") from exc
    unknown = sorted(set(params) - set(handler.params))
    if unknown:
        raise UnsupportedModuleError(
            f"module '{label}' ({type(module).__name__}) has trainable parameters "
            f"{unknown} that its handler does not compute gradients for (it handles "
            f"{list(handler.params)}); reparametrisations such as "
            "torch.nn.utils.weight_norm are not supported — remove them "
            "(torch.nn.utils.remove_weight_norm) or freeze those parameters"
        )
    for pname, p in params.items():
        if p.dim() not in (1, 2):
            raise UnsupportedModuleError(
                f"module '{label}': parameter '{pname}' has {p.dim()} dimensions; "
                "only 1-D and 2-D parameters are supported"
            )
    return handler


def _parameters_of_handled_modules(model: nn.Module, known: dict[int, str]) -> set[int]:
    """id() of every trainable parameter owned directly by a module that has a handler."""
    ids: set[int] = set()
    for module in model.modules():
        if id(module) not in known and handler_for(module) is not None:
            ids |= {id(p) for p in module.parameters(recurse=False) if p.requires_grad}
    return ids


# Modules that use their children's parameters functionally (the children's forward never
# runs), so no per-sample gradient of those parameters can be seen.
_FUNCTIONAL_PARENTS: tuple[type[nn.Module], ...] = (nn.MultiheadAttention,)


def _refuse_functional_parents(model: nn.Module) -> None:
    for name, module in model.named_modules():
        if isinstance(module, _FUNCTIONAL_PARENTS):
            trainable = sorted(n for n, p in module.named_parameters() if p.requires_grad)
            if trainable:
                raise UnsupportedModuleError(
                    f"module '{name or '<root>'}' of type {type(module).__name__} computes its "
                    "projections functionally (F.multi_head_attention_forward), so per-sample "
                    f"gradients of its trainable parameters {trainable} cannot be computed; "
                    "freeze it, or use an attention built from nn.Linear modules"
                )


def _unsupported_message(label: str, module: nn.Module, params: dict) -> str:
    cls = overriding_class(module)
    if cls is not None:
        base = next(b for b in cls.__mro__[1:] if handler_for_type(b))
        return (
            f"module '{label}' of type {type(module).__name__} subclasses the supported "
            f"{base.__module__}.{base.__name__} but {cls.__name__} overrides forward(), so the "
            f"base layer's per-sample gradient math does not apply to its trainable parameters "
            f"{sorted(params)}; register a handler for {type(module).__name__} with "
            "dprc_core.register (see docs/engine.md) or freeze it with requires_grad_(False)"
        )
    return (
        f"module '{label}' of type {type(module).__name__} has trainable parameters "
        f"{sorted(params)} but no per-sample gradient handler (supported: "
        f"{', '.join(supported_types())}); freeze it with requires_grad_(False) or "
        "register a handler with dprc_core.register (see docs/engine.md)"
    )


def refuse_activation_checkpointing(model: nn.Module) -> None:
    """Hugging Face gradient (activation) checkpointing recomputes each layer's forward inside
    the backward; refuse it (at engine construction, and again at every pass in case it was
    switched on later).

    Why not supported: the hooks must keep every hooked layer's input until that layer's output
    gradient arrives, which is most of what checkpointing frees, and the recomputed forward
    would have to be matched call by call to the first one. ``torch.utils.checkpoint`` with
    ``use_reentrant=False`` in a custom model does work (the hooks see the first forward); the
    reentrant variant runs the forward under ``torch.no_grad`` and is refused at the step.
    """
    for name, module in model.named_modules():
        for attr in ("is_activation_checkpointing", "gradient_checkpointing"):
            if getattr(type(module), attr, None) is not None or attr in vars(module):
                try:
                    on = getattr(module, attr) is True
                except AttributeError:
                    on = False
                if on:
                    raise UnsupportedModuleError(
                        f"gradient checkpointing is on (module '{name or '<root>'}'): it "
                        "recomputes the forward inside the backward, where the per-sample "
                        "hooks cannot see it, and would save little memory since the hooks "
                        "keep each layer's input anyway; disable it with "
                        "model.gradient_checkpointing_disable()"
                    )


def _compact(contribs: list[Contribution], dtype: torch.dtype) -> list[Contribution]:
    """For book-keeping: keep per-sample gradients (B, r, c) instead of the layer factors when
    they are smaller (r·c < Σ T·(r + c)); the factors' memory is then released at once."""
    mats = [c for c in contribs if isinstance(c, MatrixContribution)]
    if not mats or len(mats) != len(contribs):
        return contribs
    r, c = mats[0].rows, mats[0].cols
    if r * c >= sum(m.seq_len * (r + c) for m in mats):
        return contribs
    total = mats[0].materialize(dtype)
    for m in mats[1:]:
        total = total + m.materialize(dtype)
    return [total]


def _unflatten_batch(x: Any, b: int, lead: int) -> Any:
    if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == lead:
        return x.reshape(b, lead // b, *x.shape[1:])
    return x


def _expand_batch(x: Any, b: int) -> Any:
    if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == 1:
        return x.expand(b, *x.shape[1:])
    return x


def check_per_sample_losses(losses: Any, expected: int | None) -> None:
    if not isinstance(losses, torch.Tensor):
        raise TypeError(f"loss_fn must return a tensor of per-sample losses, got {type(losses)}")
    if losses.dim() != 1:
        raise ValueError(
            f"loss_fn must return per-sample losses of shape [B]; got shape "
            f"{tuple(losses.shape)} (a reduced loss such as .mean() cannot be clipped per sample)"
        )
    if expected is not None and losses.shape[0] != expected:
        raise ValueError(
            f"loss_fn returned {losses.shape[0]} losses for a batch of {expected} samples"
        )
