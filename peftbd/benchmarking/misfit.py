"""A JSON file read into its type (pydantic) that does not fit, said as one `UserError` line."""

from __future__ import annotations

from pydantic import ValidationError

from peftbd.errors import UserError


def misfit(where: str, error: ValidationError, what: str, fix: str) -> UserError:
    """Where, the first key that does not fit and why, how many problems, and the fix."""
    first = error.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return UserError(f"{where}: `{key}`: {first['msg']} ({error.error_count()} problem(s)): "
                     f"not {what} this code writes; {fix}")
