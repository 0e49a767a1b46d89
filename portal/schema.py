"""What /api/schema/ needs to describe views that say nothing about their schema themselves.

drf-spectacular's extensions, kept beside the API's URL map: the agent API's authentication
and bodies, and the fake request the schema is generated with (an anonymous user, whose job
visibility query would fail). With these, `manage.py check --deploy` has no schema warning,
and the API fuzzing tests see typed paths and bodies.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiViewExtension
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers


class AgentTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "migration.api.agent.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Agent <instance token>`: the token issued to an instance at launch",
        }


class AgentEventsSchema(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    target_class = "migration.api.agent.AgentEventsView"

    def view_replacement(self) -> Any:
        from migration.api.agent import AgentEventsSerializer

        acked = inline_serializer("AgentEventsAck", {"acked": serializers.IntegerField()})

        class Described(self.target_class):  # type: ignore[name-defined,misc]
            @extend_schema(request=AgentEventsSerializer, responses={200: acked})
            def post(self, *args: Any, **kwargs: Any) -> Any:
                return super().post(*args, **kwargs)

        return Described


class AgentLogsSchema(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    target_class = "migration.api.agent.AgentLogsView"

    def view_replacement(self) -> Any:
        from migration.api.agent import AgentLogsSerializer

        stored = inline_serializer("AgentLogsStored", {"stored": serializers.IntegerField()})

        class Described(self.target_class):  # type: ignore[name-defined,misc]
            @extend_schema(request=AgentLogsSerializer, responses={200: stored})
            def post(self, *args: Any, **kwargs: Any) -> Any:
                return super().post(*args, **kwargs)

        return Described


class InstancesSchema(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    target_class = "migration.api.views.InstanceViewSet"

    def view_replacement(self) -> Any:
        from migration.models import Instance

        class Described(self.target_class):  # type: ignore[name-defined,misc]
            def get_queryset(self) -> Any:
                if getattr(self, "swagger_fake_view", False):
                    return Instance.objects.none()
                return super().get_queryset()

        return Described
