"""The IMDS-compatible metadata endpoint Baton serves for each local instance (DESIGN §5).

`BATON_METADATA_URL` of a local agent is `<portal>/imds/<instance id>/<key>`; below it are the
AWS paths the agent polls, so the same agent code runs here and on EC2:

- `PUT  latest/api/token` (header `X-aws-ec2-metadata-token-ttl-seconds`: 1..21600) -> token
- `GET  latest/meta-data/events/recommendations/rebalance` -> `{"noticeTime"}` or 404
- `GET  latest/meta-data/spot/instance-action` -> `{"action": "terminate", "time"}` or 404

GETs need the token (IMDSv2: 401 without). `<key>` is an HMAC of the instance id with the
secret key, so one instance cannot read (or guess) another's endpoint; a wrong key is a 404.
Tokens are signed (the secret key) and carry their instance and expiry: no database row per
token. The answers themselves come from `migration.agent.metadata_server`, shared with the
agent's interruption rehearsal. A poll costs one query by primary key; an instance Baton has
ended (released, failed) answers the final notice, as a machine that is gone would.
"""

from __future__ import annotations

import hmac
import time
from hashlib import sha256

from django.conf import settings
from django.core import signing
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from migration.agent.metadata_server import ADVANCE, FINAL, Answer, notice_answer, token_answer
from migration.choices import ACTIVE_INSTANCE_STATES
from migration.models import Instance

TOKEN_SALT = "baton.imds.token"


def metadata_key(instance_id: int) -> str:
    digest = hmac.new(settings.SECRET_KEY.encode(), f"imds:{instance_id}".encode(), sha256)
    return digest.hexdigest()[:32]


def metadata_url(instance_id: int) -> str:
    """The metadata endpoint of one instance, as its agent's BATON_METADATA_URL."""
    return f"{settings.BATON_PUBLIC_URL}/imds/{instance_id}/{metadata_key(instance_id)}"


def _plain(status: int, body: str = "") -> HttpResponse:
    return _response(Answer(status, body))


def _response(answer: Answer) -> HttpResponse:
    response = HttpResponse(answer.body, status=answer.status, content_type=answer.content_type)
    for name, value in answer.headers:
        response[name] = value
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

    def make_token(ttl: int) -> str:
        expires = round(time.time() + ttl, 3)
        return signing.dumps({"i": instance_id, "exp": expires}, salt=TOKEN_SALT)

    ttl = request.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
    return _response(token_answer(ttl, make_token))


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
    answer = notice_answer(
        level,
        timezone.now(),
        row["advance_notice_at"],
        row["final_notice_at"],
        row["reclaim_at"] or row["ended_at"],
        gone=row["state"] not in ACTIVE_INSTANCE_STATES,
    )
    return _response(answer)


@csrf_exempt
def rebalance(request: HttpRequest, instance_id: int, key: str) -> HttpResponse:
    return _notice(request, instance_id, key, ADVANCE)


@csrf_exempt
def instance_action(request: HttpRequest, instance_id: int, key: str) -> HttpResponse:
    return _notice(request, instance_id, key, FINAL)


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
