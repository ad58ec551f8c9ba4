"""The one root of aiscope's errors, and the exit code each kind stands for.

Every error a command can stop with derives from :class:`AiscopeError`; its ``exit_code`` says
which kind it is (the contract: ``2`` bad usage or bad input, ``1`` any other failure). The CLI
maps them to an exit code and one ``aiscope:`` line in one place (``aiscope.cli.main``). Code that
catches one catches only around the call that raises it.

This module sits at the bottom of the house: the agent, the simulator, the analyzer and the
report may all import it; it imports nothing of ours.
"""

from __future__ import annotations

from typing import ClassVar


class AiscopeError(Exception):
    """Anything that stops a command: exit code 1 unless a subclass says otherwise."""

    exit_code: ClassVar[int] = 1


class BadInput(AiscopeError):
    """Bad usage or bad input (a flag, a config value, a file, a store): exit code 2."""

    exit_code: ClassVar[int] = 2


class Failure(AiscopeError):
    """The input was fine but the work could not be done (a port taken, a disk full): exit 1."""

    exit_code: ClassVar[int] = 1
