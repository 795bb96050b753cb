"""Experiments: computations on a loaded model that return typed results; they never print or write files."""
