"""The exceptions that reach the user as a single line, without a traceback.

A traceback is for a bug in the harness. Everything the user can act on (bad input, a damaged record, a
full disk) is said in one line that names the key or the file and what to do, with an exit status that
tells the two apart: 2 for input refused before any compute, 1 for a run that failed.
"""


class HarnessError(Exception):
    """A failure the user can act on, said in one line."""

    exit_status = 1


SHOWN_CHARS = 80  # of a value echoed in an error: a 10,000-character value is not repeated whole


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`value` as an error line shows it: control characters escaped (a newline must not break the line),
    and cut in its middle to about `limit` characters with its length said. Both ends stay: a path's end is
    the file the line is about."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))
    if len(text) <= limit:
        return text
    end = (limit - 20) // 2
    return f"{text[:end]}...{text[-end:]} ({len(str(value)):,} characters)"


class ConfigError(HarnessError, ValueError):
    """Bad input, detected before any compute: the message names the key, the value and what is allowed."""

    exit_status = 2

    def __init__(self, key: str, value: object, allowed: str, allowed_chars: int = 400):
        self.key, self.value, self.allowed, self.allowed_chars = key, value, allowed, allowed_chars
        if len(str(value)) > SHOWN_CHARS:  # a library's message that quotes the value quotes it whole
            allowed = allowed.replace(str(value), shown(value))
        super().__init__(f"{shown(key)}={shown(value)} is invalid: {shown(allowed, allowed_chars)}")

    def __reduce__(self):  # pickled whole: the main process's refusal is sent to every rank of a run
        return type(self), (self.key, self.value, self.allowed, self.allowed_chars)


CHOICES_CHARS = 2000  # a registry's choices are listed whole: a list cut in its middle hides the one wanted


def choice_error(key: str, value: object, choices, why: str = "") -> ConfigError:
    """The refusal of `value` for `key`, listing every one of `choices` (after `why`, if said)."""
    return ConfigError(key, value, f"{why}choose one of: {', '.join(choices)}", CHOICES_CHARS)


def require_choice(key: str, value: object, choices) -> None:
    """Refuse `value` for `key` unless it is one of `choices`, which the message lists."""
    if value not in choices:
        raise choice_error(key, value, choices)


class RecordError(HarnessError):
    """A record file the run needs is damaged: the message names it and the way out."""


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (library messages run over several)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def one_line(e: BaseException) -> str:
    """What a failed run says about `e` in its summary and on the terminal."""
    if isinstance(e, HarnessError):
        return first_line(e)
    if isinstance(e, OSError) and e.strerror:  # a full disk, a read-only file system: the file and the reason
        where = f": {e.filename}" if e.filename else ""
        return f"{type(e).__name__}: {e.strerror}{where}"
    return f"{type(e).__name__}: {first_line(e)}"
