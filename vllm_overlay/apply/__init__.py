"""Applying the series: a run and its lock (run), each patch applied and committed (engine), what a
run reuses (record, kept_builds, staging), the patched repository's contract, export; session is
apply-patches as a whole."""
