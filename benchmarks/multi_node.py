"""Multi-node DP jobs on paper (issue 46, item 5): the bytes each rank sends per logical step,
data-parallel and FSDP2, at 1B, 8B and 70B parameters; the communication floor of a step on 100
and 400 Gb/s links; the compute time of the same step on H100s; and whether the state fits.

Arithmetic only — nothing is measured, no torch is imported. Every figure on the page is
computed here from the formulas the page states; the assumptions are dprc's code as it is
(``dprc_core/distributed.py``, ``dprc_core/sharding.py``, ``dprc_core/engine.py``,
``dprc_core/training/sharded_run.py`` and ``runner.py``):

* **data-parallel** (``sharding: none``): each rank accumulates its clipped sum in ``.grad``
  over its micro-batches with no communication; ``step()`` adds rank 0's noise and SUM-reduces
  the whole gradient once per logical batch, in ≤ 25 MiB buckets, in the parameters' dtype;
* **FSDP2** (``sharding: fsdp``): per micro-batch, FSDP2 all-gathers every block's parameters
  in the forward and again in the norm pass's backward (the root's — embeddings, final norm,
  head — once: FSDP2 keeps the root gathered from its forward to the end of its backward); the
  norm pass is ``torch.autograd.grad`` to the hooked layers' outputs, so no parameter ``.grad``
  is formed and FSDP2 reduce-scatters nothing; then the engine forms the micro-batch's whole
  clipped sum by book-keeping and **all-reduces** it (SUM, 25 MiB buckets, the parameters'
  dtype), each rank keeping its rows (``reduce_into_shards``) — once per micro-batch, and every
  rank runs as many micro-batches as the busiest (lockstep padding).

    python benchmarks/multi_node.py            # writes docs/benchmarks/multi_node.md
    python benchmarks/multi_node.py --stdout   # prints it instead
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)

from benchmarks.kit.multi_node_paper import PAGE, render
from benchmarks.kit.pages import write_page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write")
    parser.add_argument("--stdout", action="store_true", help="print the page instead")
    args = parser.parse_args(argv)
    page = render()
    if args.stdout:
        sys.stdout.write(page)
    else:
        write_page(args.out, page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
