"""``/v1/synthetic_data/jobs``: private synthetic data sets."""
