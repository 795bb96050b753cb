"""Placeholder: this command is being built (see the issue tracker)."""
