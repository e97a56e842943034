"""Fine-tuning jobs: creation and queries, runs on workers, events, the lifecycle of
statuses, retention, ledger files, dispatch, the accountant endpoints. Over ``models``."""
