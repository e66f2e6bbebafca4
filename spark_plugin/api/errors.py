"""The error of a pipeline definition that cannot run."""


class PipelineError(ValueError):
    """A pipeline definition that cannot run; the message names the operator and what to change."""
