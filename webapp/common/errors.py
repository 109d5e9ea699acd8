"""The one application-level error that services raise for invalid requests."""


class ApplicationError(Exception):
    """A request the service refuses; the message is safe to show to the user."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
