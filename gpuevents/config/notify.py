"""Config `actions.notify`: the services the `notify` action posts to, by name, with their Apprise URLs."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NotifyService(_Section):
    """One service of the `notify` action: Apprise URLs, read from the environment (they hold tokens)."""

    url_env: str | None = Field(None, description="variable holding the Apprise URL of the channel posts")
    url: str | None = Field(None, description="the Apprise URL itself, for URLs that hold no secret")
    direct_url_env: str | None = Field(None, description="variable holding the Apprise URL of a direct message, "
                                       "with `{to}` where the person's address goes")
    direct_url: str | None = Field(None, description="the direct-message URL itself, with `{to}`")
    owner_as_address: bool = Field(False, description="an owner with no address for this service in `owners` "
                                   "is addressed by the owner's name as it is")

    def channel_url(self, env: Mapping[str, str] | None = None) -> str | None:
        return _url_of(self.url, self.url_env, env)

    def person_url(self, env: Mapping[str, str] | None = None) -> str | None:
        return _url_of(self.direct_url, self.direct_url_env, env)


def _url_of(url: str | None, var: str | None, env: Mapping[str, str] | None) -> str | None:
    if url:
        return url
    value = (os.environ if env is None else env).get(var) if var else None
    return value.strip() or None if value else None


class NotifyConfig(_Section):
    services: dict[str, NotifyService] = Field(default_factory=dict, description="by name: `to: teams` or "
                                               "`service: teams` in a `notify` action")
