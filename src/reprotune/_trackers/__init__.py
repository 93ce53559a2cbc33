"""Trackers: observers of a run (MLflow), behind one small interface (``base``)."""
