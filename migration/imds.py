"""The IMDS-compatible metadata endpoint Baton serves for each local instance (DESIGN §5).

`BATON_METADATA_URL` of a local agent is `<portal>/imds/<instance id>/<key>`; below it are the
AWS paths the agent polls, so the same agent code runs here and on EC2:

- `PUT  latest/api/token` (header `X-aws-ec2-metadata-token-ttl-seconds`: 1..21600) -> token
- `GET  latest/meta-data/events/recommendations/rebalance` -> `{"noticeTime"}` or 404
- `GET  latest/meta-data/spot/instance-action` -> `{"action": "terminate", "time"}` or 404

GETs need the token (IMDSv2: 401 without). `<key>` is an HMAC of the instance id with the
secret key, so one instance cannot read (or guess) another's endpoint; a wrong key is a 404.
Tokens are signed (the secret key) and carry their instance and expiry: no database row per
token. A poll costs one query by primary key; an instance Baton has ended (released, failed)
answers the final notice, as a machine that is gone would.
"""

from __future__ import annotations

import hmac
import json
import time
from datetime import UTC, datetime
from hashlib import sha256

from django.conf import settings
from django.core import signing
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from migration.choices import ACTIVE_INSTANCE_STATES
from migration.models import Instance

TOKEN_SALT = "baton.imds.token"
MAX_TTL = 21600


def metadata_key(instance_id: int) -> str:
    digest = hmac.new(settings.SECRET_KEY.encode(), f"imds:{instance_id}".encode(), sha256)
    return digest.hexdigest()[:32]


def metadata_url(instance_id: int) -> str:
    """The metadata endpoint of one instance, as its agent's BATON_METADATA_URL."""
    return f"{settings.BATON_PUBLIC_URL}/imds/{instance_id}/{metadata_key(instance_id)}"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _plain(status: int, body: str = "") -> HttpResponse:
    response = HttpResponse(body, status=status, content_type="text/plain")
    # "No notice" is a 404 every poll of every agent: not worth a warning in the web log.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _known(instance_id: int, key: str) -> bool:
    return hmac.compare_digest(key, metadata_key(instance_id))


@csrf_exempt
def token(request: HttpRequest, instance_id: int, key: str) -> HttpResponse:
    if not _known(instance_id, key):
        return _plain(404, "Not Found")
    if request.method != "PUT":
        return _plain(405, "Method Not Allowed")
    raw = request.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_TTL):
        return _plain(400, "Bad Request")
    expires = round(time.time() + int(raw), 3)
    signed = signing.dumps({"i": instance_id, "exp": expires}, salt=TOKEN_SALT)
    response = _plain(200, signed)
    response["X-aws-ec2-metadata-token-ttl-seconds"] = raw
    return response


def _authorised(request: HttpRequest, instance_id: int) -> bool:
    given = request.headers.get("X-aws-ec2-metadata-token", "")
    if not given:
        return False
    # The expiry is inside the signed claims: one HMAC check per poll, no TimestampSigner pass.
    try:
        claims = signing.loads(given, salt=TOKEN_SALT)
        return bool(claims["i"] == instance_id and time.time() < float(claims["exp"]))
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        return False


def _notice(request: HttpRequest, instance_id: int, key: str, level: str) -> HttpResponse:
    if not _known(instance_id, key):
        return _plain(404, "Not Found")
    if request.method != "GET":
        return _plain(405, "Method Not Allowed")
    if not _authorised(request, instance_id):
        return _plain(401, "Unauthorized")
    row = (
        Instance.objects.filter(pk=instance_id)
        .values("state", "advance_notice_at", "final_notice_at", "reclaim_at", "ended_at")
        .first()
    )
    if row is None:
        return _plain(404, "Not Found")
    now = timezone.now()
    if level == "advance" and row["advance_notice_at"] and row["advance_notice_at"] <= now:
        return _json({"noticeTime": _iso(row["advance_notice_at"])})
    if level == "final":
        gone = row["state"] not in ACTIVE_INSTANCE_STATES
        if gone or (row["final_notice_at"] and row["final_notice_at"] <= now):
            when = row["reclaim_at"] or row["ended_at"] or now
            return _json({"action": "terminate", "time": _iso(when)})
    return _plain(404, "Not Found")


def _json(body: dict[str, str]) -> HttpResponse:
    return HttpResponse(json.dumps(body), content_type="application/json")


@csrf_exempt
def rebalance(request: HttpRequest, instance_id: int, key: str) -> HttpResponse:
    return _notice(request, instance_id, key, "advance")


@csrf_exempt
def instance_action(request: HttpRequest, instance_id: int, key: str) -> HttpResponse:
    return _notice(request, instance_id, key, "final")


urlpatterns = [
    path("<int:instance_id>/<str:key>/latest/api/token", token, name="imds-token"),
    path(
        "<int:instance_id>/<str:key>/latest/meta-data/events/recommendations/rebalance",
        rebalance,
        name="imds-rebalance",
    ),
    path(
        "<int:instance_id>/<str:key>/latest/meta-data/spot/instance-action",
        instance_action,
        name="imds-instance-action",
    ),
]
