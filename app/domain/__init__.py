"""The coordinator's domain layer: graph validation, the checkpoint lifecycle and the operations on it."""
