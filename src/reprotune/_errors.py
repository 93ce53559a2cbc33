"""The exceptions reprotune raises. Only the CLI turns them into messages and exit codes."""

from __future__ import annotations

import signal


class ReprotuneError(Exception):
    """Base of every error reprotune raises on purpose.

    Args:
        message: what is wrong, naming the bad value.
        source: where the value came from (file, line, column or key path), if known.
        fix: what the user can do about it.
    """

    exit_code: int = 2

    def __init__(self, message: str, *, source: str | None = None, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.fix = fix

    def __str__(self) -> str:
        # A message that opens with its source already says where (`--out 'x' is a file`).
        located = self.source and not self.message.startswith(f"{self.source} ")
        parts = [f"{self.source}: {self.message}" if located else self.message]
        if self.fix:
            parts.append(f"fix: {self.fix}")
        return "\n".join(parts)


class InputError(ReprotuneError):
    """Bad input or usage: a missing file, malformed data, an invalid option. Exit code 2."""

    exit_code = 2


class NoSpaceError(InputError):
    """A write failed because the disk (or quota) is full. Exit code 2: free space, then go on."""


class ConfigError(InputError):
    """The experiment config is invalid; carries every problem found, not just the first. The
    message lists the first :attr:`SHOWN` and counts the rest (a file of thousands of unknown keys
    is not a config, and its refusal stays a screen long)."""

    SHOWN = 30

    def __init__(self, problems: list[str], *, source: str | None = None) -> None:
        self.problems = list(problems)
        noun = "problem" if len(problems) == 1 else "problems"
        lines = [f"  - {p}" for p in problems[: self.SHOWN]]
        if len(problems) > self.SHOWN:
            lines.append(f"  ... and {len(problems) - self.SHOWN:,} more (is this the experiment config?)")
        super().__init__(f"invalid config ({len(problems):,} {noun}):\n" + "\n".join(lines), source=source)


class SchemaVersionError(InputError):
    """A file written by reprotune carries a schema version this version cannot read."""


class RunFailedError(ReprotuneError):
    """A run (training, verification) failed for a reason that is not bad input. Exit code 1."""

    exit_code = 1


class Interrupted(KeyboardInterrupt):
    """A run was stopped by a signal (SIGTERM, SIGHUP) and handled as Ctrl-C is.

    Args:
        signum: the signal's number; the CLI exits with ``128 + signum``, as a shell does.
        then: what the CLI says to do next, in place of its resume hint (the run completed, what
            came after it did not).
    """

    def __init__(self, signum: int, *, then: str | None = None) -> None:
        self.signum = signum
        self.then = then
        try:
            self.signal_name = signal.Signals(signum).name
        except ValueError:
            self.signal_name = f"signal {signum}"
        super().__init__(f"stopped by {self.signal_name}")
