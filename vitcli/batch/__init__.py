"""Batch experiments: `vitcli run` configs, their manifests and summaries, merging shards."""
