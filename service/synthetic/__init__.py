"""Synthetic-data jobs: records generated from a DP model, with their provenance."""
