"""Assemble docs/benchmarks.md from the sections the benchmark scripts write.

Each script writes its own section (``docs/benchmarks_<name>.md``) so that it can be rerun
alone; this script stitches the current sections, in a fixed order, under a common preface.

    .venv/bin/python benchmarks/report.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SECTIONS = [
    ("norm_layer", "benchmarks/norm_layer.py"),
    ("step", "benchmarks/step.py"),
    ("step_cuda", "benchmarks/step.py --device cuda"),
    ("accountant", "benchmarks/accountant.py"),
    ("sketch_sigma", "benchmarks/sketch_sigma.py"),
    ("sketch_memory", "benchmarks/sketch_memory.py"),
    ("sketch_utility", "benchmarks/sketch_utility.py"),
    ("dpftrl", "benchmarks/dpftrl_linear.py"),
    ("dpftrl_lm", "benchmarks/dpftrl_lm.py"),
    ("utility", "benchmarks/utility.py"),
    ("audit", "benchmarks/audit.py"),
    ("audit_per_example", "benchmarks/audit.py --cases per-example --eps 1 3"),
    ("audit_step", "benchmarks/audit_step.py"),
    ("budget", "benchmarks/budget_contention.py"),
    ("history", "benchmarks/history_compose.py"),
    ("repeated_jobs", "benchmarks/repeated_jobs.py"),
    ("secure_noise", "benchmarks/secure_noise.py"),
    ("three_ways", "benchmarks/three_ways.py"),
    ("distributed", "benchmarks/distributed.py"),
    ("distributed_cuda", "benchmarks/distributed.py --device cuda"),
]

PREFACE = """# Benchmarks

Speed and memory targets live here, never in tests (docs/design.md §5). Every table below was
produced by the command named above it, on the machine it names; rerun with `make bench`
(or the single script) and then `python benchmarks/report.py` to refresh this page.
Comparisons are ratios inside one run, A/B interleaved; peak memory on CPU is the peak RSS of a
fresh process per configuration, minus the RSS once the inputs exist.

GPU: no GPU was available to the sessions that produced these tables; the scripts' CUDA paths
(`--device cuda`, reporting `torch.cuda.max_memory_allocated`) have not been run yet.
"""


def main() -> None:
    parts = [PREFACE]
    for name, command in SECTIONS:
        path = DOCS / f"benchmarks_{name}.md"
        if not path.exists():
            continue
        parts.append(f"<!-- section from `{command}` ({path.name}) -->\n")
        parts.append(path.read_text().strip() + "\n")
    out = DOCS / "benchmarks.md"
    out.write_text("\n".join(parts))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
