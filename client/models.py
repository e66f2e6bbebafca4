"""The API's models for SDK users: the wire contract's classes, so ``from client.models import Job`` keeps working."""

from contract.models import *  # noqa: F403 - a re-export of the contract's public names
