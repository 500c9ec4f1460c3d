"""The one exception type that reaches the user as a single line, without a traceback."""


class ConfigError(ValueError):
    """Bad input, detected before any compute: the message names the key, the value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!s} is invalid: {allowed}")
