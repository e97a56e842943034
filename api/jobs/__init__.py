"""Fine-tuning jobs: creation with a privacy plan and budget reservation, lifecycle, events,
checkpoints and the privacy ledger."""
