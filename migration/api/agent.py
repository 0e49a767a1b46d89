"""The agent API (`/api/agent/...`): authenticated by the instance's token, not a user.

Edges only: validate the batch, call migration.agent_reports, answer with what was stored.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from migration import agent_reports
from migration.agent_tokens import instance_for_token
from migration.models import Instance


class AgentPrincipal:
    """Who is calling: the agent of one instance (never a user)."""

    is_authenticated = True
    is_staff = False

    def __init__(self, instance: Instance) -> None:
        self.instance = instance


class AgentTokenAuthentication(BaseAuthentication):
    """`Authorization: Agent <token>`."""

    keyword = b"agent"

    def authenticate(self, request: Request) -> tuple[AgentPrincipal, Instance] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("expected 'Authorization: Agent <token>'")
        instance = instance_for_token(parts[1].decode("latin-1"))
        if instance is None:
            raise AuthenticationFailed("unknown agent token")
        return AgentPrincipal(instance), instance

    def authenticate_header(self, request: Request) -> str:
        return "Agent"


class IsAgent(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Instance)


class AgentEventSerializer(serializers.Serializer):
    seq = serializers.IntegerField(min_value=1)
    type = serializers.CharField(max_length=32)
    at = serializers.DateTimeField(required=False)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        checked = super().to_internal_value(data)
        return {**data, "seq": checked["seq"], "type": checked["type"]}  # other fields as sent


class AgentEventsSerializer(serializers.Serializer):
    events = AgentEventSerializer(many=True, allow_empty=True, max_length=1000)


class LogLineInSerializer(serializers.Serializer):
    line = serializers.CharField(allow_blank=True, trim_whitespace=False)
    rank = serializers.IntegerField(min_value=0, required=False)
    at = serializers.CharField(required=False)


class AgentLogsSerializer(serializers.Serializer):
    lines = LogLineInSerializer(many=True, max_length=5000)
    dropped = serializers.IntegerField(min_value=0, required=False, default=0)


class AgentView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]


class AgentEventsView(AgentView):
    def post(self, request: Request) -> Response:
        batch = AgentEventsSerializer(data=request.data)
        batch.is_valid(raise_exception=True)
        acked = agent_reports.record_agent_events(request.auth.pk, batch.validated_data["events"])
        return Response({"acked": acked})


class AgentLogsView(AgentView):
    def post(self, request: Request) -> Response:
        batch = AgentLogsSerializer(data=request.data)
        batch.is_valid(raise_exception=True)
        stored = agent_reports.record_log_lines(
            request.auth.pk, batch.validated_data["lines"], batch.validated_data["dropped"]
        )
        return Response({"stored": stored})
