"""The one exception type that reaches the user as a single line, without a traceback."""


class ConfigError(ValueError):
    """Bad input, detected before any compute: the message names the key, the value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!s} is invalid: {allowed}")


def first_line(e: Exception) -> str:
    """An exception's message cut to its first line (library messages run over several)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
