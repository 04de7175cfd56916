"""The audit of the series against another upstream: the run, what it finds, and each patch's decision."""
