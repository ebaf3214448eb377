"""Reading results: the results table, per-generation reports and pictures,
run diffs, and `kvprobe explain`."""
