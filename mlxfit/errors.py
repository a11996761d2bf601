"""The one error type library code raises; only the CLI turns it into an exit."""


class MlxfitError(Exception):
    """A problem the user can fix, with a message that names it."""

    exit_code = 1


class BadInput(MlxfitError):
    """The user's input is unusable (a usage error: exit status 2)."""

    exit_code = 2
