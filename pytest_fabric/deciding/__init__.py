"""deciding/: from launches to a verdict: statistics, gates, outcome words, the suite file's
thresholds."""
