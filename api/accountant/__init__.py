"""Pure privacy-accounting computations over HTTP (no ledger is touched)."""
