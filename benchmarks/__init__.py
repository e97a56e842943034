"""The benchmark scripts (``python benchmarks/<name>.py``, docs/benchmarks.md) and their kit
(``benchmarks.kit``): what the scripts share, and what tests guard of them."""
