"""Operators' tools: backup and its manifest, database copy, restore, the consistency
check. Over ``jobs``."""
