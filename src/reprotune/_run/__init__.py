"""The run directory: its layout (every file name), the record, the ledger, checkpoints, the
fingerprints of code and environment, drift, and the read side used by the proof commands."""
