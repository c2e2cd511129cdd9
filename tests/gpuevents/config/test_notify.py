"""`actions.notify` services: a URL written in the config wins, else the variable named is read (trimmed; empty
is unset); unknown keys are refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuevents.config.notify import NotifyConfig, NotifyService


def test_the_url_in_the_config_wins_over_its_variable() -> None:
    svc = NotifyService(url="json://hooks.local/in", url_env="TEAMS_URL")
    assert svc.channel_url({"TEAMS_URL": "json://other"}) == "json://hooks.local/in"


def test_a_variable_is_read_from_the_given_environment_trimmed_and_empty_is_unset() -> None:
    svc = NotifyService(url_env="TEAMS_URL", direct_url_env="TEAMS_DM")
    assert svc.channel_url({"TEAMS_URL": " msteams://token \n"}) == "msteams://token"
    assert svc.person_url({"TEAMS_DM": "   "}) is None
    assert svc.person_url({}) is None
    assert NotifyService().channel_url({"ANY": "x"}) is None


def test_without_an_environment_given_the_process_one_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEVENTS_TEST_NOTIFY_URL", "ntfy://topic")
    assert NotifyService(url_env="GPUEVENTS_TEST_NOTIFY_URL").channel_url() == "ntfy://topic"


def test_services_by_name_and_unknown_keys_refused() -> None:
    cfg = NotifyConfig.model_validate({"services": {"teams": {"direct_url": "x://{to}", "owner_as_address": True}}})
    assert cfg.services["teams"].person_url({}) == "x://{to}" and cfg.services["teams"].owner_as_address
    with pytest.raises(ValidationError, match="urll"):
        NotifyConfig.model_validate({"services": {"teams": {"urll": "x://"}}})
