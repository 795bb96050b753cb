"""The thin CLI layer: one module per command; each parses, calls one core function and hands results to output."""
