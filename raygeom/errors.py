"""One exception type for every user-facing failure; the CLI prints its message as one line."""


class RaygeomError(Exception):
    """A failure the user can fix (bad input, missing model, unwritable output)."""


class InputError(RaygeomError, ValueError):
    """Arrays or parameters that the numerics cannot accept."""
