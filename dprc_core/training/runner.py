"""The job runner: one DP fine-tuning job, end to end, usable without the service.

``run_job(spec)`` loads the local model and tokenizer (safetensors, no remote code), optionally
wraps LoRA, tokenizes the JSONL file, plans the privacy (q, steps, δ, σ — see
:mod:`dprc_core.training.plan`), and trains with **real Poisson sampling** at rate q for the
planned steps; a logical batch is split into micro-batches of at most
``max_physical_batch_size`` and noise is added once per logical batch. Every step is recorded
in the privacy ledger as it runs; checkpoints (:mod:`dprc_core.training.checkpoint`) are written
every ``checkpoint_every`` steps, when asked to stop, and at the end.

Resume: a run whose ``output_dir`` holds a checkpoint continues at the next step with the
saved weights, optimizer, sampler and generator states. Steps after the last checkpoint of a
crashed run were never released; they are replayed with the same randomness. The ledger counts
every step of the released chain exactly once, so a run that completes — resumed or not — ends
with ε equal to the planned ε.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dprc_core.accounting import PrivacyEvent, PrivacyLedger
from dprc_core.engine import PrivacyEngine, accounting_clipping_for, norm_plan
from dprc_core.losses import causal_lm_per_sample_loss, sequence_classification_per_sample_loss
from dprc_core.noise import Gaussian, NuDPFTRL
from dprc_core.norm_methods import method_names
from dprc_core.seeding import derive_seed, fresh_seed
from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training.data import TASKS, TokenizedData, label_names, load_jsonl, tokenize
from dprc_core.training.models import LoraSpec, load_model, load_tokenizer
from dprc_core.training.plan import PrivacyPlan, plan_privacy
from dprc_core.training.sampling import FixedOrderSampler, PoissonSampler

OPTIMIZERS = ("adam", "sgd")


@dataclass
class JobSpec:
    """Everything a job needs; ``from_dict`` validates a YAML/JSON mapping."""

    model: str  # a local model directory (the service resolves allow-listed names to it)
    task: str  # causal_lm | classification
    train_file: str
    output_dir: str
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
    clipping: str = "hutch"  # exact | fgc | ghost | hutch | hutchpp | auto
    k: int = 32
    checkpoint_every: int | None = None
    seed: int | None = None
    max_physical_batch_size: int = 16
    device: str = "auto"
    dtype: str = "float32"
    report_train_loss: bool = True
    epsilon_every: int = 10  # compute ε spent for progress every this many steps
    classes: list[str] | None = None  # classification: class names (default: from the file)
    # train only the parameters whose names contain one of these strings (e.g. ["classifier"]
    # for a DP linear probe); None: every parameter (or the LoRA adapters when lora is set)
    train_only: list[str] | None = None
    noise_mechanism: str = "gaussian"  # gaussian (Poisson DP-SGD) | nu_dpftrl (fixed order)
    nu: float | None = None  # nu_dpftrl damping
    bands: int | None = None  # nu_dpftrl banding (None: un-banded)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.clipping not in method_names():
            raise ValueError(f"clipping must be one of {method_names()}, got {self.clipping!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
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
    """Run (or resume) a job; returns when it finishes or ``should_stop()`` turns true."""
    t0 = time.perf_counter()
    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = _device(spec.device)
    tokenizer = load_tokenizer(spec.model)
    data, classes = prepare_data(spec, tokenizer)
    n = len(data)
    latest = ckpt_io.latest_checkpoint(out) if resume else None
    lora = spec.lora
    if latest is not None:
        state, opt_state, rng, ledger_json = ckpt_io.load_resume(latest)
        if lora is not None:
            model = load_model(
                spec.model,
                spec.task,
                num_labels=len(classes or []) or None,
                dtype=spec.dtype,
                adapter_path=latest / "model",
            )
        else:
            model = load_model(
                latest / "model", spec.task, num_labels=len(classes or []) or None, dtype=spec.dtype
            )
    else:
        state, opt_state, rng, ledger_json = None, None, None, None
        model = load_model(
            spec.model,
            spec.task,
            num_labels=len(classes or []) or None,
            lora=lora,
            dtype=spec.dtype,
        )
        if classes is not None:
            model.config.id2label = dict(enumerate(classes))
            model.config.label2id = {c: i for i, c in enumerate(classes)}
    if spec.train_only is not None:
        matched = 0
        for name, p in model.named_parameters():
            keep = any(part in name for part in spec.train_only)
            p.requires_grad_(keep and p.requires_grad if lora is not None else keep)
            matched += keep
        if not matched:
            raise ValueError(f"train_only={spec.train_only} matches no parameter of the model")
    model.to(device).train()
    if spec.task == "classification" and getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = data.pad_id

    plan_methods = norm_plan(model, spec.clipping, spec.k, spec.max_seq_len)
    clipping = accounting_clipping_for(plan_methods)
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
    )
    if state is not None and state["plan"] != plan.to_dict():
        raise ValueError(
            f"the checkpoint {latest} was written for another plan ({state['plan']}); "
            f"this spec plans {plan.to_dict()}. Use a fresh output_dir"
        )

    params = [p for p in model.parameters() if p.requires_grad]
    if spec.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=spec.learning_rate)
    else:
        opt = torch.optim.SGD(params, lr=spec.learning_rate)
    seed = spec.seed if spec.seed is not None else fresh_seed()
    engine = PrivacyEngine(
        model,
        opt,
        max_grad_norm=spec.max_grad_norm,
        noise_multiplier=plan.noise_multiplier,
        expected_batch_size=plan.batch_size,
        norm_method=spec.clipping,
        k=spec.k,
        seed=seed,
        max_seq_len=spec.max_seq_len if spec.clipping == "auto" else None,
        noise_mechanism=NuDPFTRL(spec.nu, spec.bands)
        # type: ignore[arg-type]
        if (spec.noise_mechanism == NuDPFTRL.name)
        else Gaussian(),
    )
    assert engine.accounting_clipping == clipping
    fixed = spec.noise_mechanism == "nu_dpftrl"
    sampler_seed = derive_seed(seed, "sampler")
    sampler: PoissonSampler | FixedOrderSampler
    if fixed:
        sampler = FixedOrderSampler(n, int(spec.batch_size), steps=plan.steps, seed=sampler_seed)
    else:
        sampler = PoissonSampler(n, plan.sample_rate, plan.steps, seed=sampler_seed)
    prior: list[PrivacyEvent] = []
    done = 0
    if state is not None:
        assert opt_state is not None and rng is not None and ledger_json is not None
        opt.load_state_dict(opt_state)
        engine.load_state_dict(
            {
                "steps": state["engine"]["steps"],
                "seed": state["engine"]["seed"],
                "generators": {
                    k[len("engine:") :]: v for k, v in rng.items() if k.startswith("engine:")
                },
                "noise": {k[len("noise:") :]: v for k, v in rng.items() if k.startswith("noise:")},
            }
        )
        if isinstance(sampler, FixedOrderSampler):
            sampler = FixedOrderSampler.from_state_dict(state["sampler"])
        else:
            sampler.generator.set_state(rng["sampler"])
        prior = list(PrivacyLedger.from_json(ledger_json).events)
        done = int(state["steps_done"])
    resumed_from = done
    loss_fn = (
        causal_lm_per_sample_loss
        if spec.task == "causal_lm"
        else sequence_classification_per_sample_loss
    )
    losses: list[float] = []

    def ledger_at(steps: int) -> PrivacyLedger:
        if fixed:  # one matrix mechanism: the released chain is its first `steps` steps
            return PrivacyLedger([plan.event(steps)] if steps else [])
        seg = steps - resumed_from
        return _ledger(prior, plan.event(seg) if seg else None)

    def ledger_now() -> PrivacyLedger:
        return ledger_at(done)

    eps_cache: dict[int, float] = {}

    def epsilon_at(steps: int) -> float:  # the accountant takes ~0.1–0.5 s: once per count
        if steps not in eps_cache:
            eps_cache[steps] = ledger_at(steps).epsilon(plan.delta)
        return eps_cache[steps]

    def epsilon_at_done() -> float:
        return epsilon_at(done)

    def epsilon_bound() -> float:
        """An upper bound on ε spent after `done` steps, computed once per `epsilon_every`
        steps: ε at the next multiple of `epsilon_every` (ε only grows with steps), exact at
        those multiples, at checkpoints and at the end. Never a stale, smaller value."""
        every = spec.epsilon_every
        return epsilon_at(min(plan.steps, -(-done // every) * every))

    def save() -> Path:
        ledger = ledger_now()
        eps = epsilon_at_done()
        est = engine.state_dict()
        rng_out = {f"engine:{k}": v for k, v in est["generators"].items()}
        rng_out.update({f"noise:{k}": v for k, v in est["noise"].items()})
        if isinstance(sampler, PoissonSampler):
            rng_out["sampler"] = sampler.generator.get_state()
        return ckpt_io.save_checkpoint(
            out,
            step=done,
            model=model,
            tokenizer=tokenizer,
            ledger_json=ledger.to_json(),
            metadata={
                "step": done,
                "steps": plan.steps,
                "epsilon": eps,
                "delta": plan.delta,
                "task": spec.task,
                "classes": classes,
                "lora": lora is not None,
                "noise_multiplier": plan.noise_multiplier,
                "clipping": clipping,
                "k": plan.k,
                "sample_rate": plan.sample_rate,
                "noise_mechanism": plan.mechanism,
                "nu": plan.nu,
                "bands": plan.bands,
            },
            optimizer=opt,
            rng=rng_out,
            state={
                "steps_done": done,
                "plan": plan.to_dict(),
                "engine": {"steps": est["steps"], "seed": est["seed"]},
                "sampler": sampler.state_dict() if isinstance(sampler, FixedOrderSampler) else None,
            },
        )

    last_ckpt = latest
    status = "succeeded"
    samples = iter(sampler)  # on resume its generator already holds the state after `done` draws
    try:
        while done < plan.steps:
            idx = next(samples)
            for chunk in idx.split(spec.max_physical_batch_size):
                batch = {k: v.to(device) for k, v in data.batch(chunk).items()}
                engine.accumulate(loss_fn, batch)
            stats = engine.step()
            done += 1
            if stats.batch_size - stats.dropped > 0 and math.isfinite(stats.mean_loss):
                losses.append(stats.mean_loss)
            due = spec.checkpoint_every is not None and done % spec.checkpoint_every == 0
            stop = should_stop is not None and should_stop()
            saved = None
            if due or done == plan.steps or stop:
                last_ckpt = save()
                saved = str(last_ckpt)
            epsilon_now = epsilon_at_done() if saved else epsilon_bound()
            if on_progress is not None:
                on_progress(
                    Progress(
                        step=done,
                        steps=plan.steps,
                        batch_size=stats.batch_size,
                        loss=stats.mean_loss if spec.report_train_loss else None,
                        clipped_fraction=stats.clipped_fraction if spec.report_train_loss else None,
                        dropped=stats.dropped,
                        epsilon=epsilon_now,
                        checkpoint=saved,
                    )
                )
            if stop and done < plan.steps:
                status = "stopped"
                break
    finally:
        engine.detach()
    if last_ckpt is None:  # zero steps planned cannot happen (steps >= 1); keep mypy calm
        last_ckpt = save()
    return JobResult(
        status=status,
        steps_done=done,
        steps=plan.steps,
        epsilon=epsilon_at_done(),
        delta=plan.delta,
        plan=plan,
        checkpoint=str(last_ckpt),
        seconds=time.perf_counter() - t0,
        resumed_from=resumed_from,
        losses=losses if spec.report_train_loss else [],
    )


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
