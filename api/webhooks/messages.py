"""What a notification of a run's end says, and its three forms: an email, a Slack message, a Teams card.

Everything is read when the message is sent, from the finished run: its job and environment, its
outcome (a success whose ``run_results.json`` holds a warning is a warning), its duration, the first
step that failed with the first error lines of its log, the models that failed or warned, and the
owners of those models' groups (``manifest.json``'s ``groups``, each with ``owner.email``).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any

from markupsafe import Markup

from runplane.basics.types import RunStatus

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
FAILED_NODES = frozenset({"error", "fail", "runtime error"})
WARNED_NODES = frozenset({"warn"})


class Outcome(enum.StrEnum):
    """How a run ended, in the words of dbt Cloud's notification lists (on_success, on_warning, ...)."""

    SUCCEEDED = "succeeded"
    WARNED = "warned"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class NodeResults:
    """The nodes of a run's results that did not succeed, by unique id."""

    failed: list[str] = field(default_factory=list)
    warned: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunEnd:
    """Everything a message about one finished run says."""

    run_id: int
    job_id: int
    job_name: str
    environment_name: str
    project_name: str
    outcome: Outcome
    seconds: float | None
    status_message: str
    failing_step: str
    error_lines: list[str]
    failed_models: list[str]
    warned_models: list[str]
    run_url: str
    delivery_key: str
    test: bool = False


def outcome_of(status: int, nodes: NodeResults) -> Outcome:
    """The outcome a run's status and its results make: a success with a warned node is a warning."""
    match RunStatus(status):
        case RunStatus.SUCCESS:
            return Outcome.WARNED if nodes.warned else Outcome.SUCCEEDED
        case RunStatus.ERROR:
            return Outcome.FAILED
        case RunStatus.CANCELLED:
            return Outcome.CANCELLED
        case RunStatus.QUEUED | RunStatus.STARTING | RunStatus.RUNNING:
            raise ValueError(f"run status {status} has not ended")


def node_results(documents: Iterable[bytes]) -> NodeResults:
    """The failed and warned nodes of every ``run_results.json`` (or ``sources.json``) given, in order, once each."""
    failed: dict[str, None] = {}
    warned: dict[str, None] = {}
    for content in documents:
        try:
            results = json.loads(content)["results"]
        except (ValueError, KeyError, TypeError):
            continue
        for result in results if isinstance(results, list) else []:
            if not isinstance(result, dict):
                continue
            unique_id = str(result.get("unique_id", ""))
            status = str(result.get("status", ""))
            if status in FAILED_NODES:
                failed[unique_id] = None
            elif status in WARNED_NODES:
                warned[unique_id] = None
    return NodeResults(list(failed), [w for w in warned if w not in failed])


def error_lines(log: str, limit: int) -> list[str]:
    """``limit`` lines of a step's log from the first that names an error (dbt's error and its detail
    follow it); the last lines when none does."""
    lines = [ANSI.sub("", line).rstrip() for line in log.splitlines()]
    lines = [line for line in lines if line.strip()]
    first = next((i for i, line in enumerate(lines) if "error" in line.lower()), None)
    return lines[first : first + limit] if first is not None else lines[-limit:]


def owners_of(manifest: bytes, nodes: Iterable[str]) -> dict[str, list[str]]:
    """Owner email → the given nodes in groups that owner owns. A test counts for the model it tests."""
    try:
        document = json.loads(manifest)
        groups = document.get("groups") or {}
        all_nodes = {**(document.get("nodes") or {}), **(document.get("sources") or {})}
    except (ValueError, AttributeError):
        return {}
    emails: dict[str, str] = {}
    for group in groups.values() if isinstance(groups, dict) else []:
        owner = group.get("owner") if isinstance(group, dict) else None
        email = owner.get("email") if isinstance(owner, dict) else None
        if isinstance(email, str) and "@" in email:
            emails[str(group.get("name"))] = email.strip()
    owned: dict[str, list[str]] = {}
    for unique_id in nodes:
        group_name = _group_of(all_nodes, unique_id)
        email = emails.get(group_name or "")
        if email is not None and unique_id not in owned.setdefault(email, []):
            owned[email].append(unique_id)
    return owned


def _group_of(all_nodes: dict[str, Any], unique_id: str) -> str | None:
    node = all_nodes.get(unique_id)
    if not isinstance(node, dict):
        return None
    group = node.get("group") or (node.get("config") or {}).get("group")
    if group:
        return str(group)
    tested = node.get("attached_node") or next(iter((node.get("depends_on") or {}).get("nodes") or []), None)
    if isinstance(tested, str) and tested != unique_id:
        tested_node = all_nodes.get(tested)
        if isinstance(tested_node, dict):
            group = tested_node.get("group") or (tested_node.get("config") or {}).get("group")
            return str(group) if group else None
    return None


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "not started"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start is not None and end is not None else None


def title(end: RunEnd) -> str:
    prefix = "[test] " if end.test else ""
    where = f" in {end.environment_name}" if end.environment_name else ""
    return f"{prefix}{end.job_name}{where}: run #{end.run_id} {end.outcome.value}"


def _facts(end: RunEnd) -> list[tuple[str, str]]:
    facts = [("Job", end.job_name), ("Environment", end.environment_name or "none (plain commands)")]
    if end.project_name:
        facts.append(("Project", end.project_name))
    facts += [("Outcome", end.outcome.value), ("Duration", duration(end.seconds)), ("Run", f"#{end.run_id}")]
    return facts


def _listed(models: list[str], limit: int) -> list[str]:
    if len(models) <= limit:
        return models
    return [*models[:limit], f"and {len(models) - limit} more"]


def plain_text(end: RunEnd, models_listed: int) -> str:
    lines = [title(end), ""]
    lines += [f"{name}: {value}" for name, value in _facts(end)]
    if end.status_message:
        lines += ["", end.status_message]
    if end.failing_step:
        lines += ["", f"Failing step: {end.failing_step}", *(f"    {line}" for line in end.error_lines)]
    if end.failed_models:
        lines += ["", "Failed:", *(f"  - {m}" for m in _listed(end.failed_models, models_listed))]
    if end.warned_models:
        lines += ["", "Warned:", *(f"  - {m}" for m in _listed(end.warned_models, models_listed))]
    lines += ["", f"Run page: {end.run_url}", "", f"Delivery key: {end.delivery_key}"]
    return "\n".join(lines) + "\n"


COLOURS = {
    Outcome.SUCCEEDED: "#1a7f37",
    Outcome.WARNED: "#9a6700",
    Outcome.FAILED: "#cf222e",
    Outcome.CANCELLED: "#57606a",
}


def html(end: RunEnd, models_listed: int) -> str:
    """The email's HTML part: inline styles only, as mail clients read them."""
    rows = Markup("").join(
        Markup('<tr><th align="left" style="padding:2px 12px 2px 0;color:#57606a">{}</th><td>{}</td></tr>').format(
            name, value
        )
        for name, value in _facts(end)
    )
    parts = [
        Markup(
            '<!doctype html><html><body style="font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;'
            'color:#1f2328;max-width:640px">'
            '<h2 style="border-left:6px solid {colour};padding-left:10px">{title}</h2>'
            '<table style="border-collapse:collapse">{rows}</table>'
        ).format(colour=COLOURS[end.outcome], title=title(end), rows=rows)
    ]
    if end.status_message:
        parts.append(Markup("<p>{}</p>").format(end.status_message))
    if end.failing_step:
        parts.append(
            Markup(
                "<h3>Failing step</h3><p><code>{}</code></p>"
                '<pre style="background:#f6f8fa;padding:8px;white-space:pre-wrap">{}</pre>'
            ).format(end.failing_step, "\n".join(end.error_lines))
        )
    for heading, models in (("Failed models", end.failed_models), ("Warned models", end.warned_models)):
        if models:
            items = Markup("").join(
                Markup("<li><code>{}</code></li>").format(m) for m in _listed(models, models_listed)
            )
            parts.append(Markup("<h3>{}</h3><ul>{}</ul>").format(heading, items))
    parts.append(
        Markup(
            '<p><a href="{url}" style="background:#0969da;color:#fff;padding:6px 12px;border-radius:6px;'
            'text-decoration:none">Open run #{run}</a></p>'
            '<p style="color:#57606a;font-size:12px">Delivery key {key}</p></body></html>'
        ).format(url=end.run_url, run=end.run_id, key=end.delivery_key)
    )
    return str(Markup("").join(parts))


def email(end: RunEnd, *, sender: str, to: str, models_listed: int) -> EmailMessage:
    """The email of a run's end: text and HTML alternatives; its Message-ID is the delivery key's, the
    same on every attempt, so a mail store that sees it twice keeps one."""
    message = EmailMessage()
    message["Subject"] = title(end)
    message["From"] = sender
    message["To"] = to
    message["Date"] = formatdate(localtime=False)
    domain = sender.rsplit("@", 1)[-1] or "runplane"
    message["Message-ID"] = f"<{end.delivery_key}@{domain}>" if end.delivery_key else make_msgid()
    message["X-Runplane-Delivery"] = end.delivery_key
    message.set_content(plain_text(end, models_listed))
    message.add_alternative(html(end, models_listed), subtype="html")
    return message


def _mrkdwn(text: str) -> str:
    """Slack's three escapes for text it formats."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


EMOJI = {
    Outcome.SUCCEEDED: ":white_check_mark:",
    Outcome.WARNED: ":warning:",
    Outcome.FAILED: ":x:",
    Outcome.CANCELLED: ":no_entry_sign:",
}


def slack_message(end: RunEnd, models_listed: int) -> dict[str, Any]:
    """Block Kit blocks and their plain ``text`` fallback (what notifications show), for an incoming
    webhook or chat.postMessage."""
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title(end)[:150], "emoji": True}},
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{name}*\n{_mrkdwn(value)}"} for name, value in _facts(end)[:10]],
        },
    ]
    if end.status_message:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _mrkdwn(end.status_message)[:3000]}})
    if end.failing_step:
        quoted = "\n".join(end.error_lines)
        text = f"*Failing step* `{_mrkdwn(end.failing_step)}`\n```{_mrkdwn(quoted)}```"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}})
    for heading, models in (("Failed models", end.failed_models), ("Warned models", end.warned_models)):
        if models:
            listed = "\n".join(f"• `{_mrkdwn(m)}`" for m in _listed(models, models_listed))
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*{heading}*\n{listed}"[:3000]}})
    blocks.append(
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": f"Open run #{end.run_id}"},
                    "url": end.run_url,
                    "action_id": "open_run",
                }
            ],
        }
    )
    blocks.append(
        {"type": "context", "elements": [{"type": "mrkdwn", "text": f"{EMOJI[end.outcome]} {end.delivery_key}"}]}
    )
    return {"text": title(end), "blocks": blocks}


TEAMS_COLOURS = {
    Outcome.SUCCEEDED: "Good",
    Outcome.WARNED: "Warning",
    Outcome.FAILED: "Attention",
    Outcome.CANCELLED: "Default",
}


def teams_message(end: RunEnd, models_listed: int) -> dict[str, Any]:
    """What a Teams Workflows webhook ("Send webhook alerts to a channel") takes: a ``message`` whose
    attachment is an Adaptive Card."""
    body: list[dict[str, Any]] = [
        {
            "type": "TextBlock",
            "text": title(end),
            "size": "Large",
            "weight": "Bolder",
            "wrap": True,
            "color": TEAMS_COLOURS[end.outcome],
        },
        {"type": "FactSet", "facts": [{"title": name, "value": value} for name, value in _facts(end)]},
    ]
    if end.status_message:
        body.append({"type": "TextBlock", "text": end.status_message, "wrap": True})
    if end.failing_step:
        body.append(
            {"type": "TextBlock", "text": f"Failing step: {end.failing_step}", "weight": "Bolder", "wrap": True}
        )
        body.append({"type": "TextBlock", "text": "\n\n".join(end.error_lines), "fontType": "Monospace", "wrap": True})
    for heading, models in (("Failed models", end.failed_models), ("Warned models", end.warned_models)):
        if models:
            body.append({"type": "TextBlock", "text": heading, "weight": "Bolder", "wrap": True})
            body.append(
                {"type": "TextBlock", "text": "\n".join(f"- {m}" for m in _listed(models, models_listed)), "wrap": True}
            )
    body.append({"type": "TextBlock", "text": end.delivery_key, "isSubtle": True, "size": "Small", "wrap": True})
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
        "actions": [{"type": "Action.OpenUrl", "title": f"Open run #{end.run_id}", "url": end.run_url}],
    }
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
        ],
    }
