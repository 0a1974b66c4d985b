"""The command line's name, and the command that continues a stored audit: said by the command line when an audit
is interrupted and written into a partial audit's report, in one place."""
from __future__ import annotations

PROG = "overinterp-fast"


def resume_command(folder: str) -> str:
    """The command that continues the stored audit in ``folder``."""
    return f"{PROG} audit --resume {folder}"
