"""Each script's first local import (``import _bootstrap``): run as ``python benchmarks/x.py``,
Python puts ``benchmarks/`` first on the import path, not the checkout; this puts the
checkout's root first, so that ``benchmarks.kit``, ``dprc_core`` and the service packages are
this checkout's, from any working directory. The one place a benchmark touches the path."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if sys.path[:1] != [ROOT]:
    sys.path.insert(0, ROOT)
