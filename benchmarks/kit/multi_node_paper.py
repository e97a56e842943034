"""The arithmetic of benchmarks/multi_node.py (issue 46, item 5), and the page it writes: kept
in the kit so tests/test_multi_node_paper.py checks the formulas and that the committed page is
this module's output. The assumptions are stated in benchmarks/multi_node.py's docstring and on
the page."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "multi_node.md"

GB = 1e9  # decimal gigabytes on the page (link speeds are decimal too)
GIB = 2**30
BUCKET_BYTES = 25 * 2**20  # dprc_core.distributed.BUCKET_BYTES

# the stated setting
BF16 = 2  # bytes per parameter, gradient and value on the wire (the job's dtype: bfloat16)
SEQUENCES = 1024  # expected logical (Poisson) batch, in sequences
SEQ_LEN = 1024  # tokens per sequence
MICRO_CAP = 16  # max_physical_batch_size's default: at most this many sequences a micro-batch
WORLDS = ((2, 8), (8, 8))  # nodes × GPUs per node
LINKS_GBPS = (100, 400)  # inter-node bandwidth per GPU (one NIC per GPU), Gb/s
H100_BF16_DENSE = 989e12  # FLOP/s, H100 SXM, bf16 dense
MFU = 0.40
GPU_BYTES = 80 * GIB  # an 80 GB H100
RESERVE_BYTES = 4 * GIB  # CUDA context, NCCL buffers, allocator slack: not for tensors
DP_OVERHEAD = 1.12  # measured: hutch/bookkeeping ÷ non-private, T = 1024 (docs/benchmarks/step.md)
HUTCH_K = 32


@dataclass(frozen=True)
class Model:
    """A Llama-3-like decoder: no biases, RMSNorm, grouped-query attention, SwiGLU MLP."""

    name: str
    hidden: int  # d
    layers: int  # L
    heads: int
    kv_heads: int
    intermediate: int  # f
    vocab: int  # V
    tied: bool  # input embedding and output head share one matrix

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        d, kv, f = self.hidden, self.kv_dim, self.intermediate
        return 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d  # q, o; k, v; gate, up, down; 2 norms

    @property
    def block_params(self) -> int:
        return self.layers * self.layer_params

    @property
    def root_params(self) -> int:
        """What fully_shard(model) holds beyond the blocks: embeddings, head, final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.block_params + self.root_params

    @property
    def matmul_params(self) -> int:
        """Parameters used in a matrix product per token: the blocks' linears and the head (the
        embedding lookup and the norms are not products)."""
        d, kv, f = self.hidden, self.kv_dim, self.intermediate
        return self.layers * (2 * d * d + 2 * d * kv + 3 * d * f) + self.vocab * self.hidden

    @property
    def largest_param(self) -> int:
        return self.vocab * self.hidden

    def linears(self) -> list[tuple[int, int]]:
        """(inputs, outputs) of every linear layer, the head included."""
        d, kv, f = self.hidden, self.kv_dim, self.intermediate
        per_layer = [(d, d), (d, kv), (d, kv), (d, d), (d, f), (d, f), (f, d)]
        return per_layer * self.layers + [(d, self.vocab)]


MODELS = (
    # Llama 3.2 1B's shape
    Model(
        "1B",
        hidden=2048,
        layers=16,
        heads=32,
        kv_heads=8,
        intermediate=8192,
        vocab=128256,
        tied=True,
    ),
    # Llama 3.1 8B's shape
    Model(
        "8B",
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        intermediate=14336,
        vocab=128256,
        tied=False,
    ),
    # Llama 3.1 70B's shape
    Model(
        "70B",
        hidden=8192,
        layers=80,
        heads=64,
        kv_heads=8,
        intermediate=28672,
        vocab=128256,
        tied=False,
    ),
)


# -- collectives (ring; what ONE rank sends — and receives: a ring is symmetric)
def ring_all_reduce_bytes(payload: float, world: int) -> float:
    """A ring all-reduce of ``payload`` bytes: reduce-scatter then all-gather, each rank sends
    (W−1)/W of the payload in each half."""
    return 2 * (world - 1) / world * payload


def ring_all_gather_bytes(whole: float, world: int) -> float:
    """A ring all-gather whose result is ``whole`` bytes: each rank sends (W−1)/W of it."""
    return (world - 1) / world * whole


def buckets(payload: float) -> int:
    """How many all-reduce calls the engine makes for ``payload`` bytes (25 MiB buckets)."""
    return math.ceil(payload / BUCKET_BYTES)


# -- one logical step
def dp_step_bytes(m: Model, world: int, width: int = BF16) -> float:
    """Data-parallel: one all-reduce of the whole (noised) clipped sum per logical batch."""
    return ring_all_reduce_bytes(m.params * width, world)


@dataclass(frozen=True)
class FsdpMicroBatch:
    gather_forward: float  # blocks + root, all-gathered for the forward
    gather_backward: float  # blocks again for the norm pass's backward (root kept)
    reduce_clipped: float  # the engine's all-reduce of the micro-batch's whole clipped sum

    @property
    def total(self) -> float:
        return self.gather_forward + self.gather_backward + self.reduce_clipped


def fsdp_micro_batch_bytes(m: Model, world: int, width: int = BF16) -> FsdpMicroBatch:
    return FsdpMicroBatch(
        gather_forward=ring_all_gather_bytes((m.block_params + m.root_params) * width, world),
        gather_backward=ring_all_gather_bytes(m.block_params * width, world),
        reduce_clipped=ring_all_reduce_bytes(m.params * width, world),
    )


def busiest_share(sequences: float, world: int) -> float:
    """The sequences of the busiest rank in a step: a rank's share of a Poisson batch is
    Poisson with mean B/W; taken as its mean + 3 standard deviations."""
    mean = sequences / world
    return mean + 3 * math.sqrt(mean)


def micro_batches(sequences: float, world: int, micro: int) -> int:
    """Micro-batches every rank runs in a step (lockstep: as many as the busiest rank)."""
    return math.ceil(busiest_share(sequences, world) / micro)


def link_seconds(nbytes: float, gbps: float) -> float:
    """Bandwidth floor: bytes a rank sends ÷ the per-GPU inter-node bandwidth."""
    return nbytes / (gbps * 1e9 / 8)


# -- compute
def step_flops(m: Model, sequences: float, seq_len: int) -> float:
    """6·P_mm per token (forward 2, backward 4) + attention's 6·L·T·d per token."""
    tokens = sequences * seq_len
    return tokens * (6 * m.matmul_params + 6 * m.layers * seq_len * m.hidden)


def hutch_flops(m: Model, sequences: float, seq_len: int, k: int = HUTCH_K) -> float:
    """Randomized clipping's norm sketch on every linear: G_i·P_i then A_iᵀ(G_iP_i), 2k(d+p) per
    token per layer (the engine's other work — book-keeping's Σ c_i A_iᵀG_i — replaces the
    backward's weight gradients, so it is inside the 6·P)."""
    return sequences * seq_len * sum(2 * k * (i + o) for i, o in m.linears())


def compute_seconds(flops: float, world: int, mfu: float = MFU) -> float:
    return flops / (world * H100_BF16_DENSE * mfu)


# -- memory (bytes on one GPU)
def activation_bytes_per_token(m: Model, width: int = BF16) -> float:
    """An estimate of what one token keeps alive through a micro-batch's norm pass and
    book-keeping: autograd's saved tensors of a Llama block without activation checkpointing
    (dprc refuses it) and SDPA attention, 7d + 2kv + 4f values; the book-keeping output
    gradients G of its seven linears, 3d + 2kv + 2f; the head's logits and their G (V each, the
    dtype's width) and the loss's float32 copy of the logits and its gradient (8·V bytes)."""
    d, kv, f = m.hidden, m.kv_dim, m.intermediate
    per_layer = (7 * d + 2 * kv + 4 * f) + (3 * d + 2 * kv + 2 * f)
    return width * (m.layers * per_layer + 2 * m.vocab + 2 * d) + 8 * m.vocab


@dataclass(frozen=True)
class Fit:
    layout: str  # "data-parallel" or "FSDP2"
    world: int
    state: float  # parameters + gradients + Adam's two moments (the job's dtype)
    step_extra: float  # step(): the noised copy (data-parallel) / shard sums (FSDP)
    gathered: float  # FSDP: root kept whole + two blocks (one prefetched) + a reduction bucket
    load_peak: float  # the runner loads the whole model onto each rank's GPU before sharding
    per_sequence: float  # activations of one sequence
    micro: int  # sequences a micro-batch that fit (0: not even one)

    @property
    def fits_at_load(self) -> bool:
        return self.load_peak <= GPU_BYTES - RESERVE_BYTES


def fit(m: Model, layout: str, world: int, width: int = BF16, seq_len: int = SEQ_LEN) -> Fit:
    usable = GPU_BYTES - RESERVE_BYTES
    whole = float(m.params * width)
    per_sequence = activation_bytes_per_token(m, width) * seq_len
    if layout == "data-parallel":
        state, step_extra, gathered = 4 * whole, whole, 0.0
    else:
        state, step_extra = 4 * whole / world, 2 * whole / world
        bucket = 2 * max(BUCKET_BYTES, m.largest_param * width)  # the whole sums + their flat copy
        gathered = m.root_params * width + 2 * m.layer_params * width + bucket
    steady = state + gathered
    room = usable - steady
    micro = 0
    if state + step_extra <= usable and room > 0:
        micro = min(MICRO_CAP, int(room // per_sequence))
    return Fit(layout, world, state, step_extra, gathered, whole, per_sequence, micro)


# -- the page
def _gb(x: float) -> str:
    return f"{x / GB:,.1f}"


def _s(x: float) -> str:
    return f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def render() -> str:
    out: list[str] = []
    w = out.append
    w("# Multi-node jobs on paper: bytes per step, the link floor, compute and memory")
    w("")
    w("`python benchmarks/multi_node.py` (issue 46, item 5). **This page is arithmetic, not a")
    w("measurement**: every number below is computed by that script from the formulas stated")
    w("here and from dprc's code as it is; nothing was run on a GPU or a network. Where the code")
    w("decides the traffic, the page follows the code, not what FSDP or DDP would do by default.")
    w("")
    w("## The setting")
    w("")
    w("Models (Llama-3-like: no biases, RMSNorm, grouped-query attention, SwiGLU; the parameter")
    w("counts follow from the shapes):")
    w("")
    w(
        "| model | hidden d | layers L | heads / KV heads | KV width | MLP f | vocab V "
        "| embeddings | parameters P | in blocks | root (embeddings, head, final norm) "
        "| in products P_mm |"
    )
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in MODELS:
        w(
            f"| {m.name} | {m.hidden:,} | {m.layers} | {m.heads} / {m.kv_heads} | {m.kv_dim:,} "
            f"| {m.intermediate:,} | {m.vocab:,} | {'tied' if m.tied else 'untied'} "
            f"| {m.params:,} | {m.block_params:,} | {m.root_params:,} | {m.matmul_params:,} |"
        )
    w("")
    tokens = SEQUENCES * SEQ_LEN
    w(
        f"* **Dtype**: the job's `dtype: bfloat16` — parameters, gradients, clipped sums, noise, "
        f"Adam's moments and everything on the wire {BF16} bytes a value (b = {BF16}). dprc has no "
        "mixed precision in a job: the runner does not pass an `mp_policy`, so FSDP gathers and "
        "the engine reduces in the parameters' dtype. A job in the default `dtype: float32` "
        "sends and holds **twice** every byte figure below. (The library takes FSDP2 mixed "
        "precision, docs/engine.md: float32 parameters gathered in bfloat16; the engine's "
        "all-reduce is then in float32, 4 bytes a value, twice this page's reduction term.)"
    )
    w(
        f"* **Batch**: an expected logical (Poisson) batch of B = {SEQUENCES:,} sequences × "
        f"T = {SEQ_LEN:,} tokens = {tokens:,} tokens a step, split by example index over the W "
        "ranks."
    )
    w("* **Shapes**: " + "; ".join(f"{n} nodes × {g} GPUs = W {n * g}" for n, g in WORLDS) + ".")
    w(
        f"* **Links**: {' and '.join(f'{g} Gb/s' for g in LINKS_GBPS)} **per GPU** between nodes "
        "(one NIC per GPU, as H100 nodes ship 8 × 400 Gb/s); inside a node NVLink is far faster, "
        "so the inter-node hop is the slowest link of every ring. With **one NIC per node shared "
        "by its 8 GPUs**, every communication time below is **8×** longer."
    )
    w(
        f"* **Compute**: an H100 SXM at {MFU:.0%} MFU of {H100_BF16_DENSE / 1e12:,.0f} TFLOP/s "
        f"bf16 dense = {MFU * H100_BF16_DENSE / 1e12:,.1f} TFLOP/s a GPU."
    )
    w("")
    w("## What the code sends (the assumptions)")
    w("")
    w(
        "**Data-parallel** (`sharding: none`, `dprc_core/distributed.py`, `PrivacyEngine."
        "_add_noise_and_normalise`). Every rank holds the whole model, not wrapped in DDP. Over a "
        "logical batch each rank accumulates the clipped sums of its micro-batches in `.grad` — no "
        "communication per micro-batch. In `step()` rank 0 adds the one noise draw to its part, "
        "then the whole gradient is SUM-all-reduced **once per logical batch**, in buckets of "
        "≤ 25 MiB, in the parameters' dtype; every rank then takes the same optimizer step on its "
        "whole copy."
    )
    w("")
    w(
        "**FSDP2** (`sharding: fsdp`, `dprc_core/sharding.py`, `sharded_run.py`, "
        "`PrivacyEngine._bookkeeping_sum`). Blocks and root are `fully_shard`-ed (defaults: "
        "reshard after forward). For **every micro-batch**:"
    )
    w("")
    w(
        "1. the forward all-gathers each block's parameters (freed after the block) and the "
        "root's (kept: FSDP2 does not reshard the root between its forward and backward — "
        "torch 2.13's `FSDPState._lazy_init` clears the root's post-forward reshard);"
    )
    w(
        "2. the norm pass's backward (`torch.autograd.grad(losses.sum(), probes)`: gradients to "
        "the hooked layers' outputs only) all-gathers each block's parameters again; it forms no "
        "parameter `.grad`, so FSDP2's own reduce-scatter has nothing to send "
        "(`FSDPParamGroup.post_backward` reduces only parameters with a gradient);"
    )
    w(
        "3. the engine forms the micro-batch's **whole** clipped sum by book-keeping "
        "(Σ c_i A_iᵀG_i) and **all-reduces** it (SUM, ≤ 25 MiB buckets or one parameter, the "
        "parameters' dtype), each rank adding its own rows to its shard (`reduce_into_shards`): "
        "an all-reduce, not a reduce-scatter, and once per micro-batch, not per step."
    )
    w("")
    w(
        "Every rank runs as many micro-batches as the busiest rank (lockstep: a rank with fewer "
        "pads, and its padding passes make the same collectives). At `step()` each rank noises its "
        "own rows — no collective beyond a one-float flag. Two-pass clipping (whose second "
        "backward would reduce-scatter through FSDP) is refused under sharding; ghost or exact "
        "norms change the FLOPs, not the traffic. Left out as negligible: the per-step gathers "
        "of example ids (8 bytes an example), counts and flags; the independence check's passes "
        "on the first step; the whole-model gather of each checkpoint (P·b, once per "
        "checkpoint)."
    )
    w("")
    w("## Formulas")
    w("")
    w("Per rank, what it sends (a ring receives the same amount):")
    w("")
    w(
        "* ring all-reduce of S bytes: **2(W−1)/W · S**; ring all-gather of a whole of S bytes: "
        "**(W−1)/W · S**;"
    )
    w("* data-parallel, per logical step: **D_dp = 2(W−1)/W · P·b**;")
    w(
        "* FSDP2, per micro-batch: **(W−1)/W · (P_blocks + P_root)·b** (forward gathers) "
        "**+ (W−1)/W · P_blocks·b** (backward gathers) **+ 2(W−1)/W · P·b** (the engine's "
        "all-reduce) = (W−1)/W · b · (2·P_blocks + P_root + 2·P) ≈ **4(W−1)/W · P·b**;"
    )
    w(
        "* FSDP2, per logical step: **D_fsdp = M ·** the above, M = micro-batches a rank runs "
        "= ⌈(B/W + 3√(B/W)) / m⌉ — the busiest rank's share (Poisson with mean B/W, taken at "
        "its mean + 3 σ) in micro-batches of m sequences (m: what fits, below, at most "
        f"{MICRO_CAP});"
    )
    w(
        "* link floor: **t_comm = D / β**, β the per-GPU inter-node bandwidth (12.5 GB/s at "
        "100 Gb/s, 50 GB/s at 400 Gb/s): the bus-bandwidth model — every rank's bytes cross the "
        "ring's slowest link at line rate; no protocol overhead (NCCL reaches ~80–90 % of it), "
        "no per-call latency (the call counts are listed: tens of µs each);"
    )
    w(
        "* compute: **F = tokens · (6·P_mm + 6·L·T·d)** FLOPs (forward 2·P_mm, backward "
        "4·P_mm, attention's 6·L·T·d per token), **t_comp = F / (W · MFU · 989 TFLOP/s)**;"
    )
    w(
        "* dprc's work on top: the step is forward (2·P_mm), the norm pass's backward to the "
        "layers' outputs (2·P_mm: no weight gradients), book-keeping's Σ c_i A_iᵀG_i (2·P_mm: "
        "the weight gradients, once, clipped) — the same 6·P_mm — plus the norms. Randomized "
        f"clipping (hutch, k = {HUTCH_K}) adds 2k·(d_in + d_out) FLOPs per token per linear "
        "(G_iP_i, then A_iᵀ(G_iP_i)); measured, the whole DP step costs "
        f"**{DP_OVERHEAD:.2f}×** the non-private step (hutch, book-keeping, T = 1,024; 1.24× "
        "with exact norms) in docs/benchmarks/step.md — on 2 CPU cores with a 4-layer model: no "
        "GPU figure exists yet (docs/benchmarks/gpu.md). The DP compute column is "
        f"t_comp × {DP_OVERHEAD:.2f};"
    )
    w(
        "* step floor: **no overlap** t_comp·1.12 + t_comm; **perfect overlap** "
        "max(t_comp·1.12, t_comm); **as the code runs**: data-parallel reduces after all "
        "micro-batches (t_comp·1.12 + t_comm, no overlap possible); FSDP2 prefetches its "
        "all-gathers under compute but the engine's all-reduce follows each micro-batch's "
        "backward (max(t_comp·1.12, t_gather) + t_reduce)."
    )
    w("")

    w("## Memory: what fits on an 80 GB H100")
    w("")
    w(
        f"Per GPU: {GPU_BYTES / GIB:.0f} GiB less {RESERVE_BYTES / GIB:.0f} GiB (context, NCCL, "
        "allocator) for tensors. State = parameters + gradients (clipped sum) + Adam's two "
        "moments = 4·P·b (÷ W under FSDP); `step()` adds the noised copy P·b (data-parallel) or "
        "the shard sums and their noised copy 2·P·b/W (FSDP); FSDP also holds the root gathered "
        "(P_root·b), two gathered blocks (one prefetched) and a reduction bucket — the largest "
        "parameter's whole sum and its flat copy (2·V·d·b). Activations per token (an "
        "estimate: dprc refuses activation checkpointing, and book-keeping keeps each linear's "
        "output gradient G to the end of the micro-batch): b·(L·(10d + 4kv + 6f) + 2V + 2d) + "
        "8V bytes (autograd's saved tensors 7d + 2kv + 4f a block with SDPA attention; G's "
        "3d + 2kv + 2f; the logits and their G; the loss's float32 logits and gradient). m = the "
        f"sequences of T = {SEQ_LEN:,} that fit beside the steady state, at most {MICRO_CAP}. "
        "**Load**: the runner loads the whole model onto each rank's device and only then "
        "`fully_shard`s it (`runner._load_model`: `model.to(device)`, then "
        "`sharded_run.shard_model`), so every rank first holds P·b on its GPU (and in host "
        "memory while loading: 8 ranks of a node load 8 copies)."
    )
    w("")
    w(
        "| model | layout | W | state GiB | + step() GiB | FSDP gathered + bucket GiB "
        "| activations / sequence GiB | m | whole model at load GiB | fits? |"
    )
    w("|---|---|---|---|---|---|---|---|---|---|")
    worlds = [n * g for n, g in WORLDS]
    fits: dict[tuple[str, str, int], Fit] = {}
    for m in MODELS:
        for layout, ws in (("data-parallel", [worlds[0]]), ("FSDP2", worlds)):
            for world in ws:
                f = fit(m, layout, world)
                fits[(m.name, layout, world)] = f
                if f.state + f.step_extra > GPU_BYTES - RESERVE_BYTES:
                    verdict = "**no**: the state does not fit"
                elif f.micro == 0:
                    verdict = "**no**: not one sequence fits beside the state"
                elif layout == "FSDP2" and not f.fits_at_load:
                    verdict = "steps yes; **load no** (whole model on the GPU before sharding)"
                else:
                    verdict = "yes"
                shown_w = "any" if layout == "data-parallel" else str(world)
                w(
                    f"| {m.name} | {layout} | {shown_w} | {f.state / GIB:,.1f} "
                    f"| {f.step_extra / GIB:,.1f} | {f.gathered / GIB:,.1f} "
                    f"| {f.per_sequence / GIB:,.1f} | {f.micro} | {f.load_peak / GIB:,.1f} "
                    f"| {verdict} |"
                )
    w("")

    def fitting(layout: str, world: int) -> str:
        names = [m.name for m in MODELS if fits[(m.name, layout, world)].micro > 0]
        return ", ".join(names) or "none"

    big = MODELS[-1]
    w(
        f"So: **data-parallel fits {fitting('data-parallel', worlds[0])}** — not "
        f"{big.name}, whose state alone is 4·P·b = {4 * big.params * BF16 / GIB:,.0f} GiB on "
        "every rank. **FSDP2 fits "
        + "; ".join(f"{fitting('FSDP2', wd)} on W = {wd}" for wd in worlds)
        + f"** for its steps; but at {big.name} **not the runner's load**: the whole model, "
        f"{big.params * BF16 / GIB:,.0f} GiB in bfloat16, lands on each GPU before "
        "`fully_shard`. A 70B job needs the model built on the meta device and loaded shard by "
        "shard (as `benchmarks/fsdp.py` builds its model), which the runner does not do yet."
    )
    w("")

    w("## Bytes per logical step, per rank")
    w("")
    w("GB = 10⁹ bytes, what one rank sends (and receives). FSDP2 at the m above.")
    w("")
    w(
        "| model | W | data-parallel GB | all-reduce calls | FSDP2 per micro-batch GB "
        "(gathers fwd + bwd + all-reduce) | m | M | FSDP2 per step GB | FSDP2 ÷ data-parallel |"
    )
    w("|---|---|---|---|---|---|---|---|---|")
    for m in MODELS:
        for world in worlds:
            dp = dp_step_bytes(m, world)
            mb = fsdp_micro_batch_bytes(m, world)
            f = fits[(m.name, "FSDP2", world)]
            mcount = micro_batches(SEQUENCES, world, max(f.micro, 1))
            fs = mb.total * mcount
            w(
                f"| {m.name} | {world} | {_gb(dp)} | {buckets(m.params * BF16):,} "
                f"| {_gb(mb.total)} ({_gb(mb.gather_forward)} + {_gb(mb.gather_backward)} + "
                f"{_gb(mb.reduce_clipped)}) | {f.micro} | {mcount} | {_gb(fs)} "
                f"| {fs / dp:,.0f}× |"
            )
    w("")
    w(
        "The data-parallel figure does not depend on the micro-batches (one reduction a step) and "
        "barely on W (2(W−1)/W → 2). FSDP2's grows with M: with this model's activations it is "
        "M ≈ the busiest rank's sequences, so it falls as W grows only through B/W."
    )
    w("")

    w("## Step time: the link floor next to compute")
    w("")
    w(
        "Seconds per logical step. Compute: t_comp (non-private) and t_comp × 1.12 (dprc). "
        "Communication: t_comm = bytes ÷ β. The step floors use dprc's compute."
    )
    w("")
    w(
        "| model | layout | W | link | compute (non-private) | compute (dprc) | t_comm "
        "| floor, no overlap | floor, perfect overlap | floor, as the code runs "
        "| comm ÷ dprc compute |"
    )
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in MODELS:
        flops = step_flops(m, SEQUENCES, SEQ_LEN)
        for world in worlds:
            comp = compute_seconds(flops, world)
            dpc = comp * DP_OVERHEAD
            for layout in ("data-parallel", "FSDP2"):
                key = (m.name, layout, world if layout == "FSDP2" else worlds[0])
                f = fits[key]
                for gbps in LINKS_GBPS:
                    if layout == "data-parallel":
                        comm = link_seconds(dp_step_bytes(m, world), gbps)
                        as_runs = dpc + comm
                    else:
                        mb = fsdp_micro_batch_bytes(m, world)
                        mcount = micro_batches(SEQUENCES, world, max(f.micro, 1))
                        gathers = link_seconds(
                            (mb.gather_forward + mb.gather_backward) * mcount, gbps
                        )
                        reduce = link_seconds(mb.reduce_clipped * mcount, gbps)
                        comm = gathers + reduce
                        as_runs = max(dpc, gathers) + reduce
                    note = "" if f.micro else " (does not fit)"
                    w(
                        f"| {m.name} | {layout}{note} | {world} | {gbps} Gb/s | {_s(comp)} "
                        f"| {_s(dpc)} | {_s(comm)} | {_s(dpc + comm)} | {_s(max(dpc, comm))} "
                        f"| {_s(as_runs)} | {comm / dpc:,.2f} |"
                    )
    w("")
    hutch = {
        m.name: hutch_flops(m, SEQUENCES, SEQ_LEN) / step_flops(m, SEQUENCES, SEQ_LEN)
        for m in MODELS
    }
    w(
        "Randomized clipping's sketch by FLOP count alone is "
        + ", ".join(f"{100 * v:.2f} % ({k})" for k, v in hutch.items())
        + " of the step's FLOPs: the measured 1.12× is the engine's other work (hooks, "
        "per-example projections drawn, book-keeping's memory traffic), which a "
        "GPU run has yet to size."
    )
    w("")

    w("## Reading")
    w("")
    dp8 = {
        (world, g): link_seconds(dp_step_bytes(MODELS[1], world), g)
        / (compute_seconds(step_flops(MODELS[1], SEQUENCES, SEQ_LEN), world) * DP_OVERHEAD)
        for world in worlds
        for g in LINKS_GBPS
    }
    w(
        "* **Data-parallel is light on the wire**: one all-reduce of 2(W−1)/W·P·b a step, "
        "whatever the micro-batches. For 8B its link time is "
        + "; ".join(
            f"{100 * v:.0f} % of dprc's compute at W = {wd}, {g} Gb/s" for (wd, g), v in dp8.items()
        )
        + ": it grows with W because compute shrinks and the bytes do not. Nothing overlaps it "
        "today (the reduction runs in `step()`, after the last micro-batch), so the no-overlap "
        "floor is the one that applies."
    )
    m70 = MODELS[2]
    f70 = fits[(m70.name, "FSDP2", worlds[-1])]
    mc70 = micro_batches(SEQUENCES, worlds[-1], max(f70.micro, 1))
    b70 = fsdp_micro_batch_bytes(m70, worlds[-1]).total * mc70
    c70 = compute_seconds(step_flops(m70, SEQUENCES, SEQ_LEN), worlds[-1]) * DP_OVERHEAD
    w(
        "* **FSDP2 under dprc is communication-bound** at these sizes: its traffic is per "
        "micro-batch (≈ 4(W−1)/W·P·b each) and its micro-batches are small, because dprc keeps "
        "every layer's activations and output gradients through the norm pass and book-keeping "
        f"(activation checkpointing is refused). 70B on W = {worlds[-1]}: m = {f70.micro}, "
        f"M = {mc70} micro-batches, {_gb(b70)} GB a rank a step: "
        f"{link_seconds(b70, LINKS_GBPS[-1]):,.0f} s at {LINKS_GBPS[-1]} Gb/s against "
        f"{c70:,.1f} s of compute."
    )
    w(
        "* What would cut FSDP2's bytes (none is in the code; the page shows the code as it "
        "is): larger micro-batches (less activation memory a sequence: activation checkpointing "
        "the hooks can live with); a **reduce-scatter** instead of the engine's all-reduce (each "
        "rank keeps only its rows anyway: that term halves, to (W−1)/W·P·b); hybrid sharding "
        "(HSDP: shard within a node, gather over NVLink, reduce across nodes — `shard_layout` "
        "refuses a 2-D mesh today). Keeping blocks gathered between forward and backward "
        "(`reshard_after_forward=False`) removes the backward gathers but holds the whole "
        "model on every rank: no use at 70B."
    )
    w(
        "* A 70B full fine-tune fits only as FSDP2, on enough GPUs for a sequence's "
        "activations, and only once the runner loads a model shard by shard."
    )
    w("")
    return "\n".join(out) + "\n"
