"""DRF authentication by API token (`Authorization: Token <key>`), against hashed tokens."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from portal.tokens import user_for_api_token


class ApiTokenAuthentication(TokenAuthentication):
    """The header of DRF's TokenAuthentication; the key is checked against a live token's
    hash (portal.models.ApiToken), so an expired or revoked token is refused."""

    def authenticate_credentials(self, key: str) -> tuple[Any, None]:
        user = user_for_api_token(key)
        if user is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return user, None
