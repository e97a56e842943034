"""Uploaded data sets (JSONL) with their privacy budgets, and checkpoint archives."""
