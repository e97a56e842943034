"""Data sets: files and uploads, example and user hashes, budget groups and their overlap,
approvals, near copies, token hashes, private-data removal, re-keying. Over ``budget``."""
