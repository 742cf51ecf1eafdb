"""history/: what outlives a session: the night model, saved nights, baselines, the JUnit file
written, read back and merged, the step model calibrated on saved nights."""
