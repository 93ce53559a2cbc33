"""Proof: compare two runs (with the difference types in ``differences``), rank causes, verify a
config, rerun a recorded run, and the HTML report."""
