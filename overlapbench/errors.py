"""The one error type users see: a single line naming the field and the fix, exit code 2; and the
checks of a spec's or an option's fields that raise it."""

from __future__ import annotations

import difflib
import json
from typing import Any


class UserError(Exception):
    """Bad input from the user: printed as one line, never with a traceback."""

    exit_code = 2


def field_name(key) -> str:
    """A spec key as it may appear in a one-line error: itself when plain, else its repr
    (a key holding a newline or a non-string key would otherwise break the line or mislead)."""
    return key if isinstance(key, str) and key.isprintable() and key.strip() == key and key else repr(key)


def shown(value) -> str:
    """A value in a message as the user wrote it in YAML or JSON, not as Python prints it:
    null, true, 1.5, 'text', [1, 2], {"a": 1}."""
    if isinstance(value, str):  # one that would break the line: escaped, as JSON writes it
        return f"'{value}'" if value.isprintable() else json.dumps(value)
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):  # not a YAML/JSON value (a Path, say): its text
        return f"'{value}'"


def unreadable(e: OSError | UnicodeDecodeError) -> str:
    """Why a file could not be read, in words rather than an exception's class name."""
    if isinstance(e, UnicodeDecodeError):
        return "not text (a binary file?)"
    if isinstance(e, IsADirectoryError):
        return "a folder, not a file"
    return e.strerror or "an I/O error"


def did_you_mean(word: str, choices) -> str:
    """' (did you mean 'x'?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def reject_unknown_keys(data: dict, allowed, where: str) -> None:
    """A one-line UserError for the first key of a spec mapping that is not in `allowed`."""
    for key in data:
        if key not in allowed:
            prefix = f"{where}." if where else ""
            raise UserError(
                f"{prefix}{field_name(key)}: unknown key{did_you_mean(key, allowed)}; "
                f"allowed: {', '.join(allowed)}"
            )


def one_line(e: BaseException, limit: int = 400) -> str:
    """An exception as 'Type: first line of its message', for a result row or a log line."""
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:limit] if text else type(e).__name__


def positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{where}: must be a positive integer, got {shown(value)}")
    return value


def listed(value: Any, where: str) -> tuple:
    """A YAML list, a scalar, or a comma-separated string, as a tuple without duplicates."""
    if isinstance(value, str):
        value = [int(s) if s.strip().isdigit() else s.strip() for s in value.split(",") if s.strip()]
    items = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not items:
        raise UserError(f"{where}: empty; give at least one value")
    repeated = [v for i, v in enumerate(items) if v in items[:i]]
    if repeated:
        raise UserError(f"{where}: {shown(repeated[0])} is listed twice; remove the duplicate")
    return items


def named(value: Any, allowed: tuple[str, ...], where: str) -> tuple[str, ...]:
    items = listed(value, where)
    for item in items:
        if item not in allowed:
            raise UserError(f"{where}: unknown {shown(item)}{did_you_mean(item, allowed)}; known: {', '.join(allowed)}")
    return items
