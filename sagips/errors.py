"""The one-line error of a bad configuration value (raised by sagips.config and by environments).

A module of its own, so that sagips.environment does not import sagips.config, which imports the environment
registry: no import circle.
"""


class ConfigError(ValueError):
    """A bad configuration value; the message is one line that names the key and says what to fix."""

    def __init__(self, message: str):
        # one line whatever the input held (a key or a value with a line break): escape the breaks visibly
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))
