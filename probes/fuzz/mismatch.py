"""What every fuzz category raises when kvref does other than its model says."""


class Mismatch(AssertionError):
    """kvref did something other than what the model says."""
