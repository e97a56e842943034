"""The job runner: one DP fine-tuning job, end to end, usable without the service.

``run_job(spec)`` loads the local model and tokenizer (safetensors, no remote code), optionally
wraps LoRA, tokenizes the JSONL file, plans the privacy (q, steps, δ, σ — see
:mod:`dprc_core.training.plan`), and trains with **real Poisson sampling** at rate q for the
planned steps; a logical batch is split into micro-batches of at most
``max_physical_batch_size`` and noise is added once per logical batch. Every step is recorded
in the privacy ledger as it runs; checkpoints (:mod:`dprc_core.training.checkpoint`) are written
every ``checkpoint_every`` steps, when asked to stop, and at the end. Each step's row goes to
``results.csv`` in ``output_dir`` (:mod:`dprc_core.training.results`); with a
``validation_file`` every checkpoint also scores ``valid_loss`` on it
(:mod:`dprc_core.training.validation`, evaluation only).

Resume: a run whose ``output_dir`` holds a checkpoint continues at the next step with the
saved weights, optimizer, sampler and generator states. Steps after the last checkpoint of a
crashed run were never released; they are replayed with the same randomness. The ledger counts
every step of the released chain exactly once, so a run that completes — resumed or not — ends
with ε equal to the planned ε.

Several processes (``torchrun`` or ``dprc train --nproc-per-node N``, see
:mod:`dprc_core.training.cli`): inside an initialised process group every rank loads the same
model and data, draws the same Poisson batch from the seed rank 0 chose and trains on its part
(:mod:`dprc_core.distributed`); rank 0 alone writes checkpoints and the ledger and reports
progress, and its stop decision is every rank's. Resume restores every rank from rank 0's
checkpoint (the same folder: one host, or a shared file system).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dprc_core.accounting import PrivacyEvent, PrivacyLedger
from dprc_core.distributed import (
    Ranks,
    broadcast_bytes,
    broadcast_flag,
    broadcast_int,
    current_ranks,
)
from dprc_core.engine import PrivacyEngine, accounting_clipping_for, norm_plan
from dprc_core.losses import causal_lm_per_sample_loss, sequence_classification_per_sample_loss
from dprc_core.noise import Gaussian, NuDPFTRL, SecureStream
from dprc_core.noise.secure_stream import new_key
from dprc_core.norm_methods import get_norm_method, method_names
from dprc_core.seeding import derive_seed, fresh_seed
from dprc_core.sketches import SHARED_SKETCH, check_sketch_mode
from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training.data import TASKS, TokenizedData, label_names, load_jsonl, tokenize
from dprc_core.training.models import (
    LoraSpec,
    check_max_seq_len,
    load_model,
    load_tokenizer,
    matches_train_only,
)
from dprc_core.training.plan import PrivacyPlan, plan_privacy
from dprc_core.training.results import ResultsFile
from dprc_core.training.sampling import FixedOrderSampler, PoissonSampler
from dprc_core.training.secure_sampling import SecurePoissonSampler
from dprc_core.training.validation import prepare_validation, validation_loss

OPTIMIZERS = ("adam", "sgd")


@dataclass
class JobSpec:
    """Everything a job needs; ``from_dict`` validates a YAML/JSON mapping."""

    model: str  # a local model directory (the service resolves allow-listed names to it)
    task: str  # causal_lm | classification
    train_file: str
    output_dir: str
    # a held-out JSONL file of the same format: valid_loss at every checkpoint (validation.py)
    validation_file: str | None = None
    epochs: float = 1.0
    batch_size: float = 32  # expected Poisson batch size
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    max_seq_len: int = 128
    lora: LoraSpec | None = None
    target_epsilon: float | None = 8.0
    target_delta: float | None = None  # default 1/N^1.1 rounded down
    noise_multiplier: float | None = None  # when given, used as is instead of calibrating
    max_grad_norm: float = 1.0
    norm_method: str = "hutch"  # exact | fgc | ghost | hutch | hutchpp | auto (the registry)
    k: int = 32
    # randomized clipping's projections: "per_example" (independent per example, hidden-scale
    # accounting; dprc_core/sketches.py) or "shared" by the batch (revealed-scale accounting);
    # None: per_example for a randomized norm method, or what a resumed checkpoint drew
    sketch: str | None = None
    checkpoint_every: int | None = None
    seed: int | None = None
    max_physical_batch_size: int = 16
    device: str = "auto"
    dtype: str = "float32"
    report_train_loss: bool = True
    # secure mode: Gaussian noise and Poisson batches from a ChaCha20 stream keyed from the OS
    # (docs/engine.md, "Secure mode"); the seed then drives only the sketches' projections
    secure_rng: bool = False
    epsilon_every: int = 10  # compute ε spent for progress every this many steps
    classes: list[str] | None = None  # classification: class names (default: from the file)
    # train only the parameters whose names contain one of these strings (e.g. ["classifier"]
    # for a DP linear probe); None: every parameter (or the LoRA adapters when lora is set)
    train_only: list[str] | None = None
    noise_mechanism: str = "gaussian"  # gaussian (Poisson DP-SGD) | nu_dpftrl (fixed order)
    nu: float | None = None  # nu_dpftrl damping
    bands: int | None = None  # nu_dpftrl banding (None: un-banded)
    # deprecated spelling of norm_method ("clipping" names the accountant's family elsewhere)
    clipping: str | None = None

    def __post_init__(self) -> None:
        if self.clipping is not None:
            warnings.warn(
                "the job field 'clipping' is deprecated; call it 'norm_method'",
                DeprecationWarning,
                stacklevel=3,
            )
            self.norm_method, self.clipping = self.clipping, None
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.norm_method not in method_names():
            raise ValueError(
                f"norm_method must be one of {method_names()}, got {self.norm_method!r}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.sketch is not None:
            check_sketch_mode(self.sketch, get_norm_method(self.norm_method).randomized)
        for flag in ("secure_rng", "report_train_loss"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        for name in ("max_seq_len", "max_physical_batch_size", "k", "epsilon_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        ce = self.checkpoint_every
        if ce is not None and (isinstance(ce, bool) or not isinstance(ce, int) or ce < 1):
            raise ValueError(f"checkpoint_every must be a positive integer, got {ce!r}")
        lr = self.learning_rate
        if (
            isinstance(lr, bool)
            or not isinstance(lr, (int, float))
            or not (math.isfinite(lr) and lr > 0)
        ):
            raise ValueError(f"learning_rate must be a finite number > 0, got {lr!r}")
        if isinstance(self.lora, dict):
            self.lora = LoraSpec(**self.lora)
        if self.train_only is not None and (
            not isinstance(self.train_only, list)
            or not self.train_only
            or not all(isinstance(x, str) and x for x in self.train_only)
        ):
            raise ValueError("train_only must be a non-empty list of parameter-name parts")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        if not isinstance(data, dict):
            raise ValueError("a job spec must be a mapping")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown job fields: {sorted(unknown)}")
        missing_value = dataclasses.MISSING
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is missing_value and f.default_factory is missing_value
        }
        missing = required - set(data)
        if missing:
            raise ValueError(f"missing job fields: {sorted(missing)}")
        return cls(**data)


@dataclass
class Progress:
    step: int
    steps: int
    batch_size: int
    loss: float | None  # None when report_train_loss is off (training loss is NOT private)
    clipped_fraction: float | None
    dropped: int
    # an upper bound on ε spent so far: exact at checkpoints, at the end and every
    # `epsilon_every` steps, else ε at the next multiple of `epsilon_every` (never stale)
    epsilon: float | None
    checkpoint: str | None = None
    valid_loss: float | None = None  # at checkpoints, with a validation file (validation.py)


@dataclass
class JobResult:
    status: str  # succeeded | stopped
    steps_done: int
    steps: int
    epsilon: float
    delta: float
    plan: PrivacyPlan
    checkpoint: str
    seconds: float
    resumed_from: int = 0
    losses: list[float] = field(default_factory=list)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _ledger(prior: list[PrivacyEvent], current: PrivacyEvent | None) -> PrivacyLedger:
    events = list(prior)
    if current is not None:
        last = events[-1] if events else None
        if last is not None and dataclasses.replace(last, steps=current.steps) == current:
            events[-1] = dataclasses.replace(last, steps=last.steps + current.steps)
        else:
            events.append(current)
    return PrivacyLedger(events)


def prepare_data(spec: JobSpec, tokenizer: Any) -> tuple[TokenizedData, list[str] | None]:
    examples = load_jsonl(spec.train_file, spec.task)
    classes = None
    if spec.task == "classification":
        classes = list(spec.classes) if spec.classes else label_names(examples.labels)
        if len(classes) < 2:
            raise ValueError(f"classification needs at least 2 classes, found {classes}")
    return tokenize(examples, tokenizer, spec.max_seq_len, classes), classes


def run_job(
    spec: JobSpec,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    resume: bool = True,
) -> JobResult:
    """Run (or resume) a job; returns when it finishes or ``should_stop()`` turns true.

    Stages: load the data and the model (from the last checkpoint when resuming); plan the
    privacy; build the engine and the sampler; restore their state; run the steps; finish."""
    t0 = time.perf_counter()
    ranks = current_ranks()
    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = _rank_device(_device(spec.device), ranks)
    check_max_seq_len(spec.model, spec.max_seq_len)  # the API's check at create, again
    tokenizer = load_tokenizer(spec.model)
    data, classes = prepare_data(spec, tokenizer)
    valid = prepare_validation(
        spec.validation_file, spec.task, tokenizer, spec.max_seq_len, classes
    )
    latest = ckpt_io.latest_checkpoint(out) if resume else None
    resumed = ckpt_io.load_resume(latest) if latest is not None else None
    model = _load_model(spec, classes, latest, data, device)
    if spec.sketch is None and resumed is not None:
        # resume as the run began: its plan says which sketch it drew (none recorded: shared)
        spec = dataclasses.replace(spec, sketch=resumed[0]["plan"].get("sketch", SHARED_SKETCH))
    plan, clipping = _plan(spec, model, len(data))
    # a plan written before sketches were recorded had shared ones
    if resumed is not None and {"sketch": SHARED_SKETCH, **resumed[0]["plan"]} != plan.to_dict():
        raise ValueError(
            f"the checkpoint {latest} was written for another plan ({resumed[0]['plan']}); "
            f"this spec plans {plan.to_dict()}. Use a fresh output_dir"
        )
    seed = broadcast_int(spec.seed if spec.seed is not None else fresh_seed(), ranks)
    root = None  # secure mode's root stream: rank 0's OS key, shared by the ranks
    if spec.secure_rng:
        root = SecureStream(broadcast_bytes(new_key() if ranks.is_main else None, ranks, 32))
    engine, opt = _build_engine(spec, model, plan, seed, root)
    assert engine.accounting_clipping == clipping
    assert engine.accounting_sketch == plan.sketch
    sampler = _build_sampler(spec, plan, len(data), seed, ranks, root)
    run = _Run(spec, plan, clipping, classes, out, model, tokenizer, engine, opt, sampler)
    run.ranks = ranks
    if resumed is not None:
        run.restore(*resumed)
    run.last_checkpoint = latest
    run.validation = valid
    recording = (  # rank 0 alone writes results.csv (and reports progress)
        _recording(ResultsFile(out, run.resumed_from), on_progress) if ranks.is_main else None
    )
    try:
        status = run.steps(data, device, recording, should_stop)
    finally:
        engine.detach()
    if run.last_checkpoint is None and ranks.is_main:  # zero steps cannot happen (steps >= 1)
        run.last_checkpoint = run.save()
    return JobResult(
        status=status,
        steps_done=run.done,
        steps=plan.steps,
        epsilon=run.epsilon_at(run.done),
        delta=plan.delta,
        plan=plan,
        checkpoint=str(run.last_checkpoint),
        seconds=time.perf_counter() - t0,
        resumed_from=run.resumed_from,
        losses=run.losses if spec.report_train_loss else [],
    )


def _recording(
    results: ResultsFile, on_progress: Callable[[Progress], None] | None
) -> Callable[[Progress], None]:
    """``on_progress`` that first appends the step's row to ``results.csv``."""

    def record(p: Progress) -> None:
        results.append(
            {
                "step": p.step,
                "train_loss": p.loss,
                "valid_loss": p.valid_loss,
                "epsilon": p.epsilon,
                "clipped_fraction": p.clipped_fraction,
                "batch_size": p.batch_size,
                "dropped": p.dropped,
            }
        )
        if on_progress is not None:
            on_progress(p)

    return record


def _load_model(
    spec: JobSpec,
    classes: list[str] | None,
    latest: Path | None,
    data: TokenizedData,
    device: torch.device,
) -> torch.nn.Module:
    """The model to train: from the last checkpoint when resuming (LoRA: the base model and
    the saved adapter), else fresh; ``train_only`` applied; on ``device``, in train mode."""
    num_labels = len(classes or []) or None
    lora = spec.lora
    if latest is not None and lora is not None:
        model = load_model(
            spec.model,
            spec.task,
            num_labels=num_labels,
            dtype=spec.dtype,
            adapter_path=latest / "model",
        )
    elif latest is not None:
        model = load_model(latest / "model", spec.task, num_labels=num_labels, dtype=spec.dtype)
    else:
        model = load_model(
            spec.model, spec.task, num_labels=num_labels, lora=lora, dtype=spec.dtype
        )
        if classes is not None:
            config = getattr(model, "config")  # noqa: B009  (a HF model's config: not typed)
            config.id2label = dict(enumerate(classes))
            config.label2id = {c: i for i, c in enumerate(classes)}
    if spec.train_only is not None:
        matched = 0
        for name, p in model.named_parameters():
            keep = matches_train_only(name, spec.train_only)
            p.requires_grad_(keep and p.requires_grad if lora is not None else keep)
            matched += keep
        if not matched:
            raise ValueError(f"train_only={spec.train_only} matches no parameter of the model")
    model.to(device).train()
    config = getattr(model, "config")  # noqa: B009  (a HF model's config: not typed)
    if spec.task == "classification" and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = data.pad_id
    return model


def _plan(spec: JobSpec, model: torch.nn.Module, n: int) -> tuple[PrivacyPlan, str]:
    """The privacy plan, accounted for the engine's resolved norm plan (its clipping family)."""
    plan_methods = norm_plan(model, spec.norm_method, spec.k, spec.max_seq_len)
    clipping = accounting_clipping_for(plan_methods)
    # nothing sketched (an auto plan of exact layers): nothing is drawn per example either
    # (None: plan_privacy's default, per-example for randomized clipping)
    sketch = spec.sketch if clipping != "exact" else SHARED_SKETCH
    plan = plan_privacy(
        dataset_size=n,
        batch_size=spec.batch_size,
        epochs=spec.epochs,
        clipping=clipping,
        k=spec.k,
        target_epsilon=None if spec.noise_multiplier is not None else spec.target_epsilon,
        delta=spec.target_delta,
        noise_multiplier_value=spec.noise_multiplier,
        mechanism=spec.noise_mechanism,
        nu=spec.nu,
        bands=spec.bands,
        sketch=sketch,
    )
    return plan, clipping


def _build_engine(
    spec: JobSpec,
    model: torch.nn.Module,
    plan: PrivacyPlan,
    seed: int,
    root: SecureStream | None = None,
) -> tuple[PrivacyEngine, torch.optim.Optimizer]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer
    if spec.optimizer == "adam":
        opt = torch.optim.Adam(params, lr=spec.learning_rate)
    else:
        opt = torch.optim.SGD(params, lr=spec.learning_rate)
    mechanism: Gaussian | NuDPFTRL = Gaussian()
    if spec.noise_mechanism == NuDPFTRL.name:
        assert spec.nu is not None  # the plan refused a nu_dpftrl job without nu
        mechanism = NuDPFTRL(spec.nu, spec.bands)
    engine = PrivacyEngine(
        model,
        opt,
        max_grad_norm=spec.max_grad_norm,
        noise_multiplier=plan.noise_multiplier,
        expected_batch_size=plan.batch_size,
        norm_method=spec.norm_method,
        k=spec.k,
        seed=seed,
        max_seq_len=spec.max_seq_len if spec.norm_method == "auto" else None,
        noise_mechanism=mechanism,
        secure_rng=spec.secure_rng,
        secure_stream=root,
        sketch=spec.sketch,
    )
    return engine, opt


def _rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """One CUDA device per rank: the one the process group's rank was bound to."""
    if ranks.distributed and device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _build_sampler(
    spec: JobSpec,
    plan: PrivacyPlan,
    n: int,
    seed: int,
    ranks: Ranks | None = None,
    root: SecureStream | None = None,
) -> PoissonSampler | FixedOrderSampler | SecurePoissonSampler:
    """Poisson batches at the planned rate (or ν-DP-FTRL's fixed order), from their own seed;
    with several ranks each takes its part of the same logical batch."""
    sampler_seed = derive_seed(seed, "sampler")
    if spec.noise_mechanism == NuDPFTRL.name:
        return FixedOrderSampler(
            n, int(spec.batch_size), steps=plan.steps, seed=sampler_seed, ranks=ranks
        )
    if root is not None:
        return SecurePoissonSampler(n, plan.sample_rate, plan.steps, stream=root, ranks=ranks)
    return PoissonSampler(n, plan.sample_rate, plan.steps, seed=sampler_seed, ranks=ranks)


class _Run:
    """A job's running state: steps done, the ledger of the released chain, ε, checkpoints."""

    def __init__(self, spec, plan, clipping, classes, out, model, tokenizer, engine, opt, sampler):
        self.spec, self.plan, self.clipping, self.classes = spec, plan, clipping, classes
        self.out, self.model, self.tokenizer = out, model, tokenizer
        self.engine, self.opt, self.sampler = engine, opt, sampler
        self.fixed = spec.noise_mechanism == NuDPFTRL.name
        self.prior: list[PrivacyEvent] = []
        self.done = 0
        self.resumed_from = 0
        self.losses: list[float] = []
        self.last_checkpoint: Path | None = None
        self._eps: dict[int, float] = {}
        self.ranks = Ranks()
        self.validation: TokenizedData | None = None  # scored at checkpoints

    def restore(self, state: dict, opt_state: dict, rng: dict, ledger_json: str) -> None:
        """Optimizer, engine (generators and noise), sampler and ledger as checkpointed."""
        if bool(state.get("secure_rng", False)) != self.spec.secure_rng:
            raise ValueError(
                f"the checkpoint was written with secure_rng={not self.spec.secure_rng}, this "
                f"spec has secure_rng={self.spec.secure_rng}: resume with the same setting"
            )
        self.opt.load_state_dict(opt_state)
        self.engine.load_state_dict(
            {
                "steps": state["engine"]["steps"],
                "seed": state["engine"]["seed"],
                "generators": {
                    k[len("engine:") :]: v for k, v in rng.items() if k.startswith("engine:")
                },
                "noise": {k[len("noise:") :]: v for k, v in rng.items() if k.startswith("noise:")},
                "projections": {
                    k[len("projections:") :]: v
                    for k, v in rng.items()
                    if k.startswith("projections:")
                },
            }
        )
        if isinstance(self.sampler, SecurePoissonSampler):
            self.sampler.load_state_dict(
                {k[len("sampler:") :]: v for k, v in rng.items() if k.startswith("sampler:")}
            )
        elif isinstance(self.sampler, FixedOrderSampler):
            self.sampler = FixedOrderSampler.from_state_dict(state["sampler"], self.ranks)
        else:
            self.sampler.generator.set_state(rng["sampler"])
        self.prior = list(PrivacyLedger.from_json(ledger_json).events)
        self.done = self.resumed_from = int(state["steps_done"])

    # -- the ledger and epsilon
    def ledger_at(self, steps: int) -> PrivacyLedger:
        if self.fixed:  # one matrix mechanism: the released chain is its first `steps` steps
            return PrivacyLedger([self.plan.event(steps)] if steps else [])
        seg = steps - self.resumed_from
        return _ledger(self.prior, self.plan.event(seg) if seg else None)

    def epsilon_at(self, steps: int) -> float:  # the accountant takes ~0.1–0.5 s: once per count
        if steps not in self._eps:
            self._eps[steps] = self.ledger_at(steps).epsilon(self.plan.delta)
        return self._eps[steps]

    def epsilon_bound(self) -> float:
        """An upper bound on ε spent after `done` steps, computed once per `epsilon_every`
        steps: ε at the next multiple of `epsilon_every` (ε only grows with steps), exact at
        those multiples, at checkpoints and at the end. Never a stale, smaller value."""
        every = self.spec.epsilon_every
        return self.epsilon_at(min(self.plan.steps, -(-self.done // every) * every))

    # -- checkpoints
    def save(self) -> Path:
        plan, done = self.plan, self.done
        est = self.engine.state_dict()
        rng_out = {f"engine:{k}": v for k, v in est["generators"].items()}
        rng_out.update({f"noise:{k}": v for k, v in est["noise"].items()})
        rng_out.update({f"projections:{k}": v for k, v in est["projections"].items()})
        if isinstance(self.sampler, PoissonSampler):
            rng_out["sampler"] = self.sampler.generator.get_state()
        elif isinstance(self.sampler, SecurePoissonSampler):  # its key: private, like the rest
            rng_out.update({f"sampler:{k}": v for k, v in self.sampler.state_dict().items()})
        return ckpt_io.save_checkpoint(
            self.out,
            step=done,
            model=self.model,
            tokenizer=self.tokenizer,
            ledger_json=self.ledger_at(done).to_json(),
            metadata={
                "step": done,
                "steps": plan.steps,
                "epsilon": self.epsilon_at(done),
                "delta": plan.delta,
                "task": self.spec.task,
                "classes": self.classes,
                "lora": self.spec.lora is not None,
                "noise_multiplier": plan.noise_multiplier,
                "clipping": self.clipping,
                "k": plan.k,
                "sketch": plan.sketch,
                "sample_rate": plan.sample_rate,
                "noise_mechanism": plan.mechanism,
                "nu": plan.nu,
                "bands": plan.bands,
            },
            optimizer=self.opt,
            rng=rng_out,
            state={
                "steps_done": done,
                "plan": plan.to_dict(),
                "engine": {"steps": est["steps"], "seed": est["seed"]},
                "secure_rng": self.spec.secure_rng,
                "sampler": self.sampler.state_dict()
                if isinstance(self.sampler, FixedOrderSampler)
                else None,
            },
        )

    # -- the steps
    def steps(
        self,
        data: TokenizedData,
        device: torch.device,
        on_progress: Callable[[Progress], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> str:
        """Run the remaining steps; "succeeded", or "stopped" when ``should_stop()`` turned
        true (after a checkpoint)."""
        spec, plan, engine = self.spec, self.plan, self.engine
        loss_fn = (
            causal_lm_per_sample_loss
            if spec.task == "causal_lm"
            else sequence_classification_per_sample_loss
        )
        samples = iter(self.sampler)  # on resume it already holds the state after `done` draws
        while self.done < plan.steps:
            idx = next(samples)
            for chunk in idx.split(spec.max_physical_batch_size):
                batch = {k: v.to(device) for k, v in data.batch(chunk).items()}
                engine.accumulate(loss_fn, batch, example_ids=chunk)  # per-example sketch keys
            stats = engine.step()
            self.done += 1
            if stats.batch_size - stats.dropped > 0 and math.isfinite(stats.mean_loss):
                self.losses.append(stats.mean_loss)
            due = spec.checkpoint_every is not None and self.done % spec.checkpoint_every == 0
            stop = should_stop is not None and should_stop()
            stop = broadcast_flag(stop, self.ranks)  # rank 0's decision, on every rank
            main = self.ranks.is_main
            saved = None
            if (due or self.done == plan.steps or stop) and main:
                self.last_checkpoint = self.save()
                saved = str(self.last_checkpoint)
            if on_progress is not None and main:
                on_progress(self._progress(stats, saved))
            if stop and self.done < plan.steps:
                return "stopped"
        return "succeeded"

    def _progress(self, stats: Any, saved: str | None) -> Progress:
        report = self.spec.report_train_loss
        return Progress(
            step=self.done,
            steps=self.plan.steps,
            batch_size=stats.batch_size,
            loss=stats.mean_loss if report else None,
            clipped_fraction=stats.clipped_fraction if report else None,
            dropped=stats.dropped,
            epsilon=self.epsilon_at(self.done) if saved else self.epsilon_bound(),
            checkpoint=saved,
            valid_loss=self._valid_loss() if saved else None,
        )

    def _valid_loss(self) -> float | None:
        if self.validation is None:
            return None
        size = self.spec.max_physical_batch_size
        return validation_loss(self.model, self.validation, self.spec.task, size)


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: TokenizedData, task: str, batch_size: int = 32) -> float:
    """Held-out accuracy (classification) or mean per-example loss (causal LM)."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(data), batch_size):
        idx = list(range(start, min(start + batch_size, len(data))))
        batch = {k: v.to(device) for k, v in data.batch(idx).items()}
        if task == "classification":
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits
            total += float((logits.argmax(-1) == batch["labels"]).sum())
        else:
            total += float(causal_lm_per_sample_loss(model, batch).sum())
        count += len(idx)
    return total / max(count, 1)
