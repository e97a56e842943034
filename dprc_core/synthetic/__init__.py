"""Private synthetic data: records from a DP model, the DP label histogram, the report."""
