"""A save refused because someone else saved first (``VersionConflict``): what they changed.

An edit form carries the version it was read at and, in a hidden field, the values it was loaded with
(never a secret: those are not in a form's values). When the save is refused, the values stored now
are set beside the loaded ones: the fields that differ are the other person's change, named at each
field, while the form keeps what this person typed. The form then carries the version stored now, so
saving it again is a choice made knowing both changes.
"""

from __future__ import annotations

import json

from api.web.form_fields import FormErrors
from runplane.basics.errors import VersionConflict

LOADED_FIELD = "loaded_values"
NOT_COMPARED = frozenset({"version", LOADED_FIELD, "csrf_token", "create_key"})


def loaded_values(values: dict[str, str]) -> str:
    """The hidden field's value: the form's values as loaded, as JSON."""
    return json.dumps({k: v for k, v in sorted(values.items()) if k not in NOT_COMPARED}, separators=(",", ":"))


def _parsed(sent: str) -> dict[str, str] | None:
    try:
        loaded = json.loads(sent)
    except ValueError:
        return None
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        return None
    return {str(k): v for k, v in loaded.items()}


def _shown(value: str) -> str:
    if value == "on":
        return "ticked"
    if not value:
        return "empty"
    first = value.splitlines()[0]
    return repr(first[:80] + ("…" if len(first) > 80 or "\n" in value else ""))


def changed_since(sent: str, now: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The fields whose stored value is no longer the one the form was loaded with: (then, now).

    Empty when the form did not say what it was loaded with (an older page, a form sent by hand)."""
    loaded = _parsed(sent)
    if loaded is None:
        return {}
    return {
        name: (loaded.get(name, ""), now.get(name, ""))
        for name in sorted((set(loaded) | set(now)) - NOT_COMPARED)
        if loaded.get(name, "") != now.get(name, "")
    }


def conflict_errors(exc: VersionConflict, changes: dict[str, tuple[str, str]], known: set[str]) -> FormErrors:
    """The refusal in words: who changed what, at each field the form shows, and what to do now."""
    said = (
        f"Not saved: someone else saved {exc.what} while you were editing it (it went from version "
        f"{exc.expected_version} to {exc.current_version})."
    )
    if changes:
        named = ", ".join(f"{name.removeprefix('conn_').replace('_', ' ')}" for name in changes)
        said += f" They changed: {named}."
    else:
        said += " Reload the form to see what it holds now."
    said += " What you typed is kept below: check it against their change and save again to apply yours."
    fields = {
        name: f"Changed by someone else from {_shown(then)} to {_shown(now)}."
        for name, (then, now) in changes.items()
        if name in known
    }
    return FormErrors(fields=fields, general=[said])
