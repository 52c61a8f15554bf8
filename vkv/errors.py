"""The one exception type a user can cause: the CLI prints its message as a single sentence."""


class VkvError(Exception):
    """Bad input or an unmet precondition, described in one sentence naming the file and field."""
