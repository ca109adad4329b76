"""The kernel every other part stands on: user-facing errors, shared numerics, config checks, checkpoint I/O and
the process group. Imports nothing else of the project."""
