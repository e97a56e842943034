"""A private synthetic data set from a training file, under one (ε, δ): the library's pipeline.

:func:`make_synthetic` runs, in a folder of its own:

1. **Render** the file for a generator (:mod:`dprc_core.synthetic.records`): text and
   classification lines become prompt-completion lines, line for line (the same units); chat
   lines stay as they are.
2. **Labels** (classification): ``labels="dp"`` releases the label histogram under DP
   (:mod:`dprc_core.synthetic.labels`, σ_h from ``label_epsilon_share`` of ε alone), or the
   caller states a public distribution (``"uniform"`` or ``{label: weight}``: no charge).
3. **Calibrate one ε.** The fine-tuning's σ is the smallest whose steps *composed with the
   histogram's release* reach at most ε at δ
   (:func:`dprc_core.accounting.calibration.calibrate_composed`), so the data set's single
   (ε, δ) covers everything that read the private file.
4. **Fine-tune** with DP-SGD (:func:`dprc_core.training.runner.run_job`, that σ as given).
5. **Generate** ``n`` records (:func:`dprc_core.synthetic.generate.synthesize`; resumable).
   Run again on the same folder, a stopped or killed run resumes: the histogram is read back
   (never released twice), the fine-tuning resumes from its last checkpoint and the
   generation from its last batch.
6. **Provenance**: ``provenance.json`` beside the records — the source file's SHA-256, the
   unit, the events (the fine-tuning's steps that ran, the histogram's), their composed ε at δ
   (recomputed from the events), the released histogram, the sampling settings.

The records are post-processing of the two releases: training on them spends nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dprc_core.accounting import epsilon_for_events
from dprc_core.accounting.calibration import calibrate_composed
from dprc_core.accounting.events import PrivacyEvent
from dprc_core.generation import SamplingSettings
from dprc_core.norm_methods import envelope_for
from dprc_core.synthetic.generate import SynthesisSpec, synthesize
from dprc_core.synthetic.labels import LabelHistogram, histogram_sigma, release_label_histogram
from dprc_core.synthetic.records import file_format, write_conditioned_file
from dprc_core.training.data import DEFAULT_USER_FIELD, label_names
from dprc_core.training.plan import PrivacyPlan, plan_privacy

DEFAULT_LABEL_EPSILON_SHARE = 0.1
PROVENANCE_FILE = "provenance.json"
RECORDS_FILE = "synthetic.jsonl"
HISTOGRAM_FILE = "label_histogram.json"


@dataclass(frozen=True)
class SyntheticResult:
    records: Path
    provenance: dict[str, Any]
    epsilon: float
    delta: float


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _labels_and_users(path: Path, user_field: str | None) -> tuple[list[Any], list[Any] | None]:
    labels, users = [], []
    field_name = user_field or DEFAULT_USER_FIELD
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                obj = json.loads(raw)
                labels.append(obj["label"])
                users.append(obj.get(field_name))
    return labels, (users if user_field is not None else None)


def label_distribution(
    labels: str | Mapping[str, float], classes: Sequence[str]
) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """A public label distribution: ``"uniform"`` over ``classes``, or ``{label: weight}``."""
    if labels == "uniform":
        return tuple(classes), tuple(1.0 / len(classes) for _ in classes)
    if not isinstance(labels, Mapping) or not labels:
        raise ValueError('labels must be "dp", "uniform" or a {label: weight} mapping')
    weights = {str(k): float(v) for k, v in labels.items()}
    if any(not math.isfinite(w) or w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError("label weights must be finite, >= 0, with a positive sum")
    return tuple(weights), tuple(weights.values())


def training_plan(spec: Any, n_units: int) -> PrivacyPlan:
    """The fine-tuning's plan at σ = 1 (its q, steps, δ, envelope and sketch): the runner
    plans the same from the same spec (checked after the run)."""
    if spec.norm_method == "auto":
        raise ValueError("a synthetic data run needs an explicit norm_method (not auto)")
    envelope = envelope_for([spec.norm_method])
    return plan_privacy(
        dataset_size=n_units,
        batch_size=spec.batch_size,
        epochs=spec.epochs,
        clipping=envelope,
        k=spec.k,
        delta=spec.target_delta,
        noise_multiplier_value=1.0,
        mechanism=spec.mechanism,
        sketch=spec.sketch if envelope != "exact" else None,
        unit=spec.privacy_unit,
        secure=spec.secure_rng,
    )


def make_synthetic(
    train: Mapping[str, Any],
    out_dir: str | Path,
    n: int,
    *,
    epsilon: float,
    delta: float | None = None,
    labels: str | Mapping[str, float] = "dp",
    label_epsilon_share: float = DEFAULT_LABEL_EPSILON_SHARE,
    prompts: Sequence[Sequence[dict[str, str]]] = (),
    sampling: SamplingSettings | None = None,
    seed: int | None = None,
    batch_size: int = 16,
    on_event: Callable[[str], None] | None = None,
) -> SyntheticResult:
    """Fine-tune ``train`` (a :class:`~dprc_core.training.runner.JobSpec` mapping without
    output_dir, target_epsilon or noise_multiplier) and write ``n`` synthetic records under
    ``out_dir``, everything together (ε, δ)-DP for the file's unit. ``seed``: every draw's
    (None: secure randomness for the noise and batches, a fresh seed for generation)."""
    from dprc_core.seeding import fresh_seed
    from dprc_core.training.models import load_model, load_tokenizer
    from dprc_core.training.runner import JobSpec, run_job

    say = on_event or (lambda _message: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for key in ("output_dir", "target_epsilon", "noise_multiplier", "target_delta"):
        if key in train:
            raise ValueError(f"{key} is set by the synthetic run, not in its training settings")
    source = Path(train["train_file"])
    fmt = file_format(source)
    if fmt not in ("text", "classification", "chat"):
        raise ValueError(f"synthetic data is made from text, classification or chat lines: {fmt}")
    user_field = train.get("user_field") if train.get("privacy_unit") == "user" else None
    rendered = source
    if fmt != "chat":
        rendered = out / "train.prompt_completion.jsonl"
        write_conditioned_file(source, rendered, user_field)
    run_seed = fresh_seed() if seed is None else seed
    settings = {
        **train,
        "task": "causal_lm",
        "train_file": str(rendered),
        "output_dir": str(out / "model"),
        "target_epsilon": None,
        "noise_multiplier": 1.0,
        "target_delta": delta,
        "seed": seed,
        "secure_rng": seed is None,
    }
    spec = JobSpec.from_dict(settings)
    histogram: LabelHistogram | None = None
    label_probs: tuple[tuple[str, ...], tuple[float, ...]] = ((), ())
    n_units, plan = _units_and_plan(spec)
    if fmt == "classification":
        file_labels, users = _labels_and_users(source, user_field)
        classes = label_names(file_labels)
        if labels == "dp":
            if not 0 < label_epsilon_share < 1:
                raise ValueError("label_epsilon_share must be in (0, 1)")
            sigma_h = histogram_sigma(label_epsilon_share * epsilon, plan.delta)
            histogram = _released_once(
                out / HISTOGRAM_FILE,
                lambda: release_label_histogram(
                    file_labels, classes, sigma_h, users=users, seed=seed
                ),
            )
            if histogram.classes != tuple(classes) or histogram.noise_multiplier != sigma_h:
                raise ValueError(
                    f"{out / HISTOGRAM_FILE} was released for other settings: use a new out_dir"
                )
            label_probs = (histogram.classes, histogram.distribution())
            say(f"released the label histogram with noise multiplier {sigma_h:.4g}")
        else:
            label_probs = label_distribution(labels, classes)
    elif labels not in ("dp", "uniform"):
        raise ValueError(f"labels are for classification data sets, not {fmt}")
    extra: list[PrivacyEvent] = [histogram.event] if histogram is not None else []

    def events(sigma: float) -> list[PrivacyEvent]:
        return [replace(plan, noise_multiplier=sigma).event(), *extra]

    sigma = calibrate_composed(events, epsilon, plan.delta)
    say(f"fine-tuning noise multiplier {sigma:.4g} (with everything else: ε ≤ {epsilon})")
    result = run_job(JobSpec.from_dict({**settings, "noise_multiplier": sigma}), on_event=on_event)
    ran = result.plan
    if (ran.sample_rate, ran.steps, ran.clipping, ran.delta) != (
        plan.sample_rate,
        plan.steps,
        plan.clipping,
        plan.delta,
    ):
        raise RuntimeError(f"the run planned {ran} where the synthetic run calibrated {plan}")
    spent = [ran.event(result.steps_done), *extra] if result.steps_done else list(extra)
    total = epsilon_for_events(spent, plan.delta) if spent else 0.0

    model_dir = Path(result.checkpoint) / "model"
    tokenizer = load_tokenizer(model_dir)
    lora_dir = model_dir if spec.lora is not None else None
    model = load_model(spec.model if lora_dir else model_dir, "causal_lm", adapter_path=lora_dir)
    synth = SynthesisSpec(
        fmt,
        n,
        sampling or SamplingSettings(),
        seed=run_seed,
        batch_size=batch_size,
        labels=label_probs[0],
        label_probs=label_probs[1],
        prompts=tuple(tuple(p) for p in prompts),
    )
    records = out / RECORDS_FILE
    synthesize(model, tokenizer, synth, records)
    provenance = {
        "source_file_sha256": file_sha256(source),
        "format": fmt,
        "privacy_unit": spec.privacy_unit,
        "epsilon": total,
        "delta": plan.delta,
        "events": [e.to_dict() for e in spent],
        "fine_tuning": {
            "noise_multiplier": sigma,
            "steps": result.steps_done,
            "plan": ran.to_dict(),
        },
        "label_histogram": histogram.to_dict() if histogram is not None else None,
        "labels": None if histogram is not None or fmt != "classification" else "public",
        "records": n,
        "sampling": {
            "temperature": synth.sampling.temperature,
            "top_p": synth.sampling.top_p,
            "max_new_tokens": synth.sampling.max_new_tokens,
        },
        "note": (
            "post-processing of the releases above: training on these records spends no "
            "privacy budget"
        ),
    }
    (out / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
    return SyntheticResult(records, provenance, total, plan.delta)


def _released_once(path: Path, release: Callable[[], LabelHistogram]) -> LabelHistogram:
    """The histogram released before in this folder (a run that stopped and is run again),
    else a new release written there before anything uses it: a release is never drawn twice,
    so it is charged once."""
    if path.exists():
        return LabelHistogram.from_dict(json.loads(path.read_text()))
    histogram = release()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(histogram.to_dict()))
    tmp.replace(path)
    return histogram


def _units_and_plan(spec: Any) -> tuple[int, PrivacyPlan]:
    from dprc_core.training.runner import load_job_data

    data = load_job_data(spec)
    units = data.units
    return units, training_plan(spec, units)
