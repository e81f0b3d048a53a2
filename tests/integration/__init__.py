"""Integration tests: tiny models built, compiled, trained and profiled in the test's own
process (or in the child process the profiler starts), input pipelines read, checkpoints
written and restored."""
