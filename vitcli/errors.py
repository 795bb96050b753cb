"""Errors meant for people: the CLI prints their message as one line and exits with their code."""


class VitcliError(Exception):
    """A failure the user can act on (bad file, missing weights, failed self-check): exit 1."""

    exit_code = 1


class UsageError(VitcliError):
    """An argument outside its valid range or form: exit 2, like a command-line parse error."""

    exit_code = 2


class AlreadyReported(VitcliError):
    """A failure whose line is already on stderr (one image of one failed): exit 1 without a second line."""
