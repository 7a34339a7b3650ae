"""Numbers read from the environment: one parser, one wording, so every
timeout's variable is refused the same way when it is not a usable value."""
import os

from .errors import StreamtraceError


def env_seconds(name, default, error=StreamtraceError):
    """The seconds the environment variable ``name`` sets, or ``default`` when
    it is unset or blank; anything but a finite number > 0 raises ``error``
    naming the variable and its value."""
    setting = os.environ.get(name)
    if setting is None or not setting.strip():
        return default
    try:
        value = float(setting)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise error(f"{name}={setting!r}: not a number of seconds > 0")
    return value
