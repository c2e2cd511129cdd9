"""A staged destructive action waits for a warning to be delivered (DESIGN §3.4): a rule whose warnings have no
real channel to go through would print them, never deliver them, and its remedy would be refused every time. So
such a rule refuses to load, at the staged action's line, saying what to configure; a dry run (the rule's or the
engine's) is exempt, as it delivers nothing either way.

A channel is configured when a warning could reach one: `slack` with a bot token (`actions.slack.token_env` or
`token_file`), `email` always (the SMTP server decides), `notify` with a service URL written in the rule or a
service of `actions.notify.services` whose URL (for a person, its direct URL) is set.
"""

from __future__ import annotations

from gpuevents.config import Config
from gpuevents.yamlpos import Located
from rules.core.inputs import WARNING_TYPES
from rules.lang.model import ActionSpec, Rule, RuleSet


def _why_not(spec: ActionSpec, config: Config) -> str | None:
    """None when this warning has a channel configured; else what to set."""
    if spec.type == "email":
        return None
    if spec.type == "slack":
        slack = config.actions.slack
        return None if slack.token() is not None else f"slack: set ${slack.token_env} (or actions.slack.token_file)"
    params = spec.params()
    to, service = str(params.get("to", "")).strip(), params.get("service")
    if "://" in to and service is None:
        return None
    name = str(service if service is not None else to)
    svc = config.actions.notify.services.get(name)
    if svc is None:
        return f"notify: no service {name!r} in actions.notify.services"
    person = service is not None and bool(to)
    url = svc.person_url() if person else svc.channel_url()
    var = (svc.direct_url_env if person else svc.url_env) or "?"
    return None if url is not None else f"notify {name}: set ${var}"


def channel_problems(rules: RuleSet, config: Config) -> list[Located]:
    """A problem per staged destructive action (needing a warning) of a rule none of whose warnings has a
    configured channel; none when the engine runs dry."""
    if config.engine.dry_run:
        return []
    problems = []
    for rule in rules:
        if rule.spec.dry_run:
            continue
        problems += _rule_problems(rule, config)
    return problems


def _rule_problems(rule: Rule, config: Config) -> list[Located]:
    warnings = [s for s in rule.spec.actions if s.type in WARNING_TYPES]
    staged = [a for a in rule.actions if a.after_s is not None and a.destructive and a.require_warning]
    if not warnings or not staged:
        return []
    missing = [why for s in warnings if (why := _why_not(s, config)) is not None]
    if len(missing) < len(warnings):
        return []
    fix = "; ".join(dict.fromkeys(missing))
    return [Located(rule.file, a.line or rule.line,
                    f"{rule.name}: actions[{a.index}] ({a.type}) is staged after a warning, and no warning of "
                    f"this rule has a channel to be delivered through ({fix}); printing is not delivery. "
                    "Configure a channel, or set require_warning: false or dry_run: true")
            for a in staged]
