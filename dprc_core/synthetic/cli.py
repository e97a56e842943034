"""``dprc synth SPEC``: a private synthetic data set from a training file, on this machine
(the library's pipeline, :func:`dprc_core.synthetic.pipeline.make_synthetic`).

The spec (YAML or JSON)::

    train:            # the fine-tuning, as in `dprc train` (no output_dir, ε or σ)
      model: path/to/causal-lm
      train_file: data.jsonl
      norm_method: exact
    out: synthetic/    # records, provenance, the model's checkpoints
    n: 1000
    epsilon: 4
    delta: 1e-6        # optional (default 1/N^1.1)
    labels: dp         # classification: dp | uniform | {label: weight}
    prompts_file: p.jsonl   # chat: one {"messages": [...]} public prompt a line
    sampling: {temperature: 1.0, top_p: 1.0, max_new_tokens: 128}
    holdout_file: heldout.jsonl   # optional: the owner's report (report.json)
    embedding_model: path/to/minilm  # optional: the report's embeddings
    seed: 0            # optional: every draw reproducible (tests); default secure
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SPEC_KEYS = {
    "train",
    "out",
    "n",
    "epsilon",
    "delta",
    "labels",
    "label_epsilon_share",
    "prompts_file",
    "sampling",
    "holdout_file",
    "embedding_model",
    "seed",
    "batch_size",
}


def add_subparser(sub: Any) -> None:
    synth = sub.add_parser(
        "synth", help="make a private synthetic data set from a training file (library)"
    )
    synth.add_argument("spec", help="synthetic data spec (YAML or JSON): docs/synthetic.md")
    synth.set_defaults(func=_synth)


def _path(base: Path, value: Any) -> str:
    p = Path(str(value))
    return str(p if p.is_absolute() else (base / p).resolve())


def _read_jsonl(path: str) -> list[Any]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _synth(args: argparse.Namespace) -> int:
    import yaml

    from dprc_core.generation import SamplingSettings
    from dprc_core.synthetic.pipeline import make_synthetic

    path = Path(args.spec)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read synthetic data spec {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"synthetic data spec {path} must be a mapping of fields")
    unknown = sorted(set(data) - SPEC_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown fields {unknown}; known: {sorted(SPEC_KEYS)}")
    for key in ("train", "out", "n", "epsilon"):
        if key not in data:
            raise ValueError(f"{path}: needs {key!r}")
    base = path.parent
    train = dict(data["train"])
    for key in ("model", "train_file"):
        if key in train:
            train[key] = _path(base, train[key])
    prompts = []
    if "prompts_file" in data:
        prompts = [obj["messages"] for obj in _read_jsonl(_path(base, data["prompts_file"]))]
    sampling = SamplingSettings(**(data.get("sampling") or {}))
    out = Path(_path(base, data["out"]))
    result = make_synthetic(
        train,
        out,
        int(data["n"]),
        epsilon=float(data["epsilon"]),
        delta=None if data.get("delta") is None else float(data["delta"]),
        labels=data.get("labels", "dp"),
        label_epsilon_share=float(data.get("label_epsilon_share", 0.1)),
        prompts=prompts,
        sampling=sampling,
        seed=data.get("seed"),
        batch_size=int(data.get("batch_size", 16)),
        on_event=lambda message: print(f"dprc synth: {message}"),
    )
    print(
        f"dprc synth: {data['n']} records in {result.records}; "
        f"(ε = {result.epsilon:.4g}, δ = {result.delta:.3g}) for the file's "
        f"{result.provenance['privacy_unit']}s, provenance in {out / 'provenance.json'}"
    )
    if "holdout_file" in data:
        from dprc_core.synthetic.report import quality_report

        report = quality_report(
            _read_jsonl(str(result.records)),
            _read_jsonl(train["train_file"]),
            _read_jsonl(_path(base, data["holdout_file"])),
            result.provenance["format"],
            _path(base, data["embedding_model"]) if "embedding_model" in data else None,
        )
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        print(
            f"dprc synth: the owner's report in {out / 'report.json'} (reads the private "
            "data: not DP, for the data owner only)"
        )
    return 0
