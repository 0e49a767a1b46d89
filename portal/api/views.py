"""POST /api/auth/token/ (a new API token for a user name and password, rate-limited) and
POST /api/auth/ws-ticket/ (a short-lived, single-use websocket ticket)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import Throttled
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from portal import tokens
from portal.api.serializers import TokenRequestSerializer, TokenSerializer, WsTicketSerializer
from portal.throttling import login_blocked_for, record_login_failure

WRONG_CREDENTIALS = "Unable to log in with provided credentials."


class TokenView(APIView):
    """A new token for `Authorization: Token <key>`; 429 with Retry-After after too many wrong
    passwords, or too many requests from one address."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "token"

    @extend_schema(
        request=TokenRequestSerializer, responses={200: TokenSerializer, 400: dict, 429: dict}
    )
    def post(self, request: Request) -> Response:
        given = TokenRequestSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        username = given.validated_data["username"]
        wait = login_blocked_for(request, username)
        if wait:
            raise Throttled(wait=wait, detail="Too many wrong passwords; try again later.")
        user = authenticate(request, username=username, password=given.validated_data["password"])
        if user is None:
            record_login_failure(request, username)
            raise serializers.ValidationError({"non_field_errors": [WRONG_CREDENTIALS]})
        issued = tokens.issue_api_token(user, name="api")
        return Response({"token": issued.key, "expires_at": issued.token.expires_at})


class WsTicketView(APIView):
    """A ticket for one websocket connection (`?ticket=...`) within a few seconds."""

    @extend_schema(request=None, responses={201: WsTicketSerializer})
    def post(self, request: Request) -> Response:
        return Response(
            {
                "ticket": tokens.issue_ws_ticket(request.user),
                "expires_in": settings.BATON_WS_TICKET_SECONDS,
            },
            status=status.HTTP_201_CREATED,
        )
