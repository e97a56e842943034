"""Write docs/benchmarks.md, the index of the benchmark pages under docs/benchmarks/.

Each script writes its own page (``docs/benchmarks/<name>.md``) so that it can be rerun alone;
this script lists the pages that exist, in a fixed order, with the command that writes each
and the verdict lines it states (``**PASS …``, ``**FAIL …``). The hand-written summary between
the ``<!-- summary -->`` markers of the current docs/benchmarks.md is kept as it is.

    .venv/bin/python benchmarks/report.py
"""

from __future__ import annotations

import re

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.pages import ROOT  # noqa: E402

DOCS = ROOT / "docs"
PAGES = DOCS / "benchmarks"
INDEX = DOCS / "benchmarks.md"
SECTIONS = [
    ("norm_layer", "benchmarks/norm_layer.py"),
    ("step", "benchmarks/step.py"),
    ("step_cuda", "benchmarks/step.py --device cuda"),
    ("first_step", "benchmarks/first_step.py"),
    ("gpu", "bash scripts/gpu_check.sh"),
    ("accountant", "benchmarks/accountant.py"),
    ("sketch_sigma", "benchmarks/sketch_sigma.py"),
    ("sketch_memory", "benchmarks/sketch_memory.py"),
    ("sketch_utility", "benchmarks/sketch_utility.py"),
    ("dpftrl", "benchmarks/dpftrl_linear.py"),
    ("dpftrl_lm", "benchmarks/dpftrl_lm.py"),
    ("utility", "benchmarks/utility.py"),
    ("dpo", "benchmarks/dpo.py --seeds 20"),
    ("synthetic", "benchmarks/synthetic.py"),
    ("audit", "benchmarks/audit.py"),
    ("audit_per_example", "benchmarks/audit.py --cases per-example --eps 1 3"),
    ("audit_step", "benchmarks/audit_step.py"),
    ("budget", "benchmarks/budget_contention.py --repeat 3"),
    ("history", "benchmarks/history_compose.py"),
    ("repeated_jobs", "benchmarks/repeated_jobs.py"),
    ("data", "benchmarks/data_scale.py"),
    ("big_n", "benchmarks/big_n.py"),
    ("secure_noise", "benchmarks/secure_noise.py"),
    ("three_ways", "benchmarks/three_ways.py"),
    ("recipes", "benchmarks/recipes.py"),
    ("user_level", "benchmarks/user_level.py --seeds 5"),
    ("distributed", "benchmarks/distributed.py"),
    ("fsdp", "benchmarks/fsdp.py"),
    ("multi_node", "benchmarks/multi_node.py"),
    ("client_startup", "benchmarks/client_startup.py"),
    ("inference", "benchmarks/inference.py --tokens 48"),
    ("distributed_cuda", "benchmarks/distributed.py --device cuda"),
]

PREFACE = """# Benchmarks

Speed and memory targets live here, never in tests (docs/design.md §5). Each page under
[benchmarks/](benchmarks/) was produced by the command listed with it, on the machine it names;
rerun with `make bench` (or the single script) and then `python benchmarks/report.py` to
refresh this index. Comparisons are ratios inside one run, A/B interleaved; peak memory on CPU
is the peak RSS of a fresh process per configuration, minus the RSS once the inputs exist.

GPU: no GPU was available to the sessions that produced these tables; the scripts' CUDA paths
(`--device cuda`, reporting `torch.cuda.max_memory_allocated`) have not been run yet. The
prepared device run, `bash scripts/gpu_check.sh` (a ~0.85B Llama at T = 2048 and 8192 in 8
minutes; `--dry-run` on a CPU), is described in [benchmarks/gpu.md](benchmarks/gpu.md).
"""

SUMMARY_START, SUMMARY_END = "<!-- summary -->", "<!-- /summary -->"
VERDICT = re.compile(r"\*\*(PASS|FAIL)\b[^*]+\*\*")  # a verdict with its statement


def kept_summary() -> str:
    """The hand-written summary of the current index, markers included ("" when absent)."""
    if not INDEX.exists():
        return ""
    text = INDEX.read_text()
    start, end = text.find(SUMMARY_START), text.find(SUMMARY_END)
    if start < 0 or end < start:
        return ""
    return text[start : end + len(SUMMARY_END)] + "\n"


def title(page: str) -> str:
    """The page's first heading, without its #s."""
    for line in page.splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return "(untitled)"


def entry(name: str, command: str, page: str) -> str:
    lines = [f"- [{title(page)}](benchmarks/{name}.md) — `{command}`"]
    lines += [f"  - {m.group(0)}" for m in VERDICT.finditer(page)]
    return "\n".join(lines)


def main() -> None:
    entries = [
        entry(name, command, path.read_text())
        for name, command in SECTIONS
        if (path := PAGES / f"{name}.md").exists()
    ]
    parts = [PREFACE, kept_summary(), "## Pages\n", "\n".join(entries) + "\n"]
    INDEX.write_text("\n".join(p for p in parts if p))
    print(f"wrote {INDEX.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
