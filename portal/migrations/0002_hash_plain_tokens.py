"""Tokens of DRF's authtoken app (kept in plain text, never expiring) become hashed API tokens
that expire after BATON_TOKEN_DAYS, and the plain-text table is dropped (decision 065)."""

import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.utils import timezone

PLAIN_TABLE = "authtoken_token"


def hash_plain_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if PLAIN_TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("portal", "ApiToken")
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id, created FROM {PLAIN_TABLE}")
        rows = cursor.fetchall()
    ApiToken.objects.bulk_create(
        ApiToken(
            user_id=user_id,
            name="api (from before tokens were hashed)",
            key_hash=hashlib.sha256(key.encode()).hexdigest(),
            prefix=key[:8],
            created_at=created or now,
            expires_at=now + timedelta(days=settings.BATON_TOKEN_DAYS),
        )
        for key, user_id, created in rows
    )
    schema_editor.execute(f"DROP TABLE {PLAIN_TABLE}")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = %s", ["authtoken"])


class Migration(migrations.Migration):
    dependencies = [("portal", "0001_api_tokens")]

    operations = [migrations.RunPython(hash_plain_tokens, migrations.RunPython.noop)]
