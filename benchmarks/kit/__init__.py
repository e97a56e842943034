"""What the benchmark scripts share, one module per kind of thing:

* :mod:`~benchmarks.kit.memory`: ``/proc`` readers (RSS, peak RSS, its reset, a sampler);
* :mod:`~benchmarks.kit.device`: torch devices: sync, peak memory on CUDA or the CPU;
* :mod:`~benchmarks.kit.timing`: wall-clock helpers;
* :mod:`~benchmarks.kit.pages`: where pages go, the machine line, hand-written parts kept;
* :mod:`~benchmarks.kit.server`: a real ``dprc serve`` (SQLite) or an in-process uvicorn,
  PostgreSQL databases, job bodies;
* :mod:`~benchmarks.kit.peers`: the non-private and Opacus steps dprc is compared with, the
  offline MiniLM weights;
* :mod:`~benchmarks.kit.engines`: the audit's deliberately broken engines;
* :mod:`~benchmarks.kit.group_privacy`: user-level budgets from example-level ones.

Tests that guard a benchmark import from here, never from a script. Importing the package
imports nothing heavy (memory benchmarks import it before they measure).
"""
