"""Baton settings. Every knob comes from the environment (see README, "Configuration").

The defaults give the embedded setup of `make run`: SQLite in BATON_HOME, local checkpoint
stores, the local capacity backend, and Redis at REDIS_URL (the launcher fills it in).
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import dj_database_url
import plotly

from portal.env import ConfigError, env_bool, env_float, env_int, env_list, env_path, env_str
from portal.files import create_private_file, private_text

BASE_DIR = Path(__file__).resolve().parent.parent
BATON_HOME = env_path("BATON_HOME", BASE_DIR / "var")
# Owner-only from the start: it holds the secret key, the demo password and the database.
BATON_HOME.mkdir(mode=0o700, parents=True, exist_ok=True)
BATON_DATA_DIR = BASE_DIR / "data"


def _secret_key() -> str:
    """DJANGO_SECRET_KEY when given, else a key generated once into BATON_HOME (mode 600)."""
    given = env_str("DJANGO_SECRET_KEY")
    if given:
        return given
    return private_text(BATON_HOME / "secret-key", lambda: secrets.token_urlsafe(50))


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.humanize",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "portal",
    "jobs",
    "migration",
    "costs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database ---------------------------------------------------------------------------------
SQLITE_PATH = BATON_HOME / "baton.sqlite3"
_database_url = env_str("DATABASE_URL")
if _database_url:
    try:
        DATABASES = {"default": dj_database_url.parse(_database_url, conn_max_age=60)}
    except ValueError as exc:
        raise ConfigError(f"DATABASE_URL is not a database URL: {exc}") from None
else:
    # Sessions and token hashes live in it: created owner-only before SQLite first opens it
    # (SQLite gives its -wal and -shm files the database file's mode).
    create_private_file(SQLITE_PATH)
    # WAL lets readers run beside one writer; IMMEDIATE takes the write lock at BEGIN so two
    # writers (web, worker, beat, agents' reports) queue on the busy timeout instead of failing
    # with "database is locked" half-way through a transaction.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(SQLITE_PATH),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": env_int("BATON_SQLITE_TIMEOUT", 30, minimum=1),
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# plotly.js comes from the plotly wheel itself (/static/plotly/plotly.min.js): no CDN.
STATICFILES_DIRS = [BASE_DIR / "static", ("plotly", Path(plotly.__file__).parent / "package_data")]
STATIC_ROOT = BATON_HOME / "static"
STATIC_ROOT.mkdir(exist_ok=True)
# Serve straight from the finders: `make run` needs no collectstatic step.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- production safety (DEBUG off) ------------------------------------------------------------
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
if env_bool("BATON_HTTPS", False):  # behind a TLS-terminating proxy
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("BATON_HSTS_SECONDS", 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("BATON_HSTS_INCLUDE_SUBDOMAINS", False)
    SECURE_HSTS_PRELOAD = env_bool("BATON_HSTS_PRELOAD", False)

# --- Redis: Celery broker, Channels layer -----------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Every install keeps to its own keys in a shared Redis (DESIGN §1): two installs on one
# machine must never take each other's tasks or see each other's websocket events.
BATON_REDIS_PREFIX = env_str(
    "BATON_REDIS_PREFIX",
    "baton-" + hashlib.sha256(str(BATON_HOME.resolve()).encode()).hexdigest()[:10],
)

# channels-redis waits for a message with a 5-s blocking read; the redis client's own default
# socket timeout is 5 s too, so an idle websocket was closed every ~5 s. A longer socket timeout
# keeps idle websockets open (redis and channels-redis are pinned in pyproject.toml).
REDIS_SOCKET_TIMEOUT_S = 30
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": REDIS_SOCKET_TIMEOUT_S,
                    "socket_connect_timeout": 5,
                }
            ],
            "prefix": env_str("BATON_CHANNEL_PREFIX", BATON_REDIS_PREFIX),
        },
    }
}
# Rate limits and websocket tickets are counted here, shared by every process of the install.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": BATON_REDIS_PREFIX,
        "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 5},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 3600,
    "global_keyprefix": f"{BATON_REDIS_PREFIX}:",
}
CELERY_TASK_DEFAULT_QUEUE = "default"
# Placement has its own worker in `make run`, so a migration is never stuck behind a
# replication copy (DESIGN §1).
CELERY_TASK_ROUTES = {
    "*.place_*": {"queue": "placement"},
    "*.start_job_task": {"queue": "placement"},
    "*.replicate_*": {"queue": "replication"},
    "*.forget_*": {"queue": "replication"},
    "*.validate_*": {"queue": "validation"},
}
CELERY_BEAT_SCHEDULE = {
    "retry-waiting-jobs": {
        "task": "migration.tasks.retry_waiting_jobs_task",
        "schedule": env_float("BATON_WAITING_RETRY_SECONDS", 10.0, minimum=1.0),
    },
    "sweep-instances": {
        "task": "migration.tasks.sweep_instances_task",
        "schedule": env_float("BATON_SWEEP_SECONDS", 5.0, minimum=0.5),
    },
    "simulate-market": {
        "task": "migration.tasks.simulate_market_task",
        "schedule": env_float("BATON_MARKET_TICK_SECONDS", 1.0, minimum=0.1),
        # A tick left in a busy queue is dropped, not run in a burst with the next ones.
        "options": {"expires": env_float("BATON_MARKET_TICK_SECONDS", 1.0, minimum=0.1)},
    },
    "refresh-spot-prices": {
        "task": "costs.tasks.refresh_spot_prices_task",
        "schedule": env_float("BATON_PRICE_REFRESH_SECONDS", 3600.0, minimum=60.0),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(BATON_HOME / "celerybeat-schedule")

# --- REST API ---------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "portal.authentication.ApiTokenAuthentication",
    ],
    # json.loads without its RecursionError and with NaN refused (portal/parsers.py).
    "DEFAULT_PARSER_CLASSES": [
        "portal.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_THROTTLE_RATES": {"token": env_str("BATON_TOKEN_RATE", "30/min")},
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "portal.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "COERCE_DECIMAL_TO_STRING": False,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Baton API",
    "DESCRIPTION": "Submit training jobs to spot GPUs and watch them survive interruptions.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from the sidecar package: served locally, no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- authentication: API tokens, websocket tickets, rate limits (portal/tokens.py) ------------
# API tokens are stored as SHA-256 hashes and expire (decision 065).
BATON_TOKEN_DAYS = env_int("BATON_TOKEN_DAYS", 30, minimum=1)
BATON_TOKEN_MAX_DAYS = 365
# Websocket tickets: single use, valid this long (decision 066).
BATON_WS_TICKET_SECONDS = 30
# Wrong passwords (login page and POST /api/auth/token/) allowed per window, per user name and
# per client address, before the next attempt is answered 429 until the window ends.
BATON_LOGIN_FAILURES_PER_USER = env_int("BATON_LOGIN_FAILURES_PER_USER", 10, minimum=1)
BATON_LOGIN_FAILURES_PER_ADDRESS = env_int("BATON_LOGIN_FAILURES_PER_ADDRESS", 30, minimum=1)
BATON_LOGIN_WINDOW_SECONDS = env_int("BATON_LOGIN_WINDOW_SECONDS", 900, minimum=1)

# --- Baton ------------------------------------------------------------------------------------
BATON_PUBLIC_URL = env_str("BATON_PUBLIC_URL", f"http://127.0.0.1:{env_int('PORT', 8000)}")
BATON_STORE_ROOT = env_path("BATON_STORE_ROOT", BATON_HOME / "stores")
BATON_INSTANCE_ROOT = BATON_HOME / "instances"
BATON_DEMO_PASSWORD_FILE = BATON_HOME / "demo-password"
# EC2 API endpoint for spot price refreshes (empty: AWS's own); a VPC endpoint or a test server.
BATON_EC2_ENDPOINT = env_str("BATON_EC2_ENDPOINT")
# Interruption rate (preemptions per hour of held spot) for a region and accelerator with no
# history: the middle of what the shipped V100 traces show per zone (0.3 to 1.2 per hour).
BATON_DEFAULT_INTERRUPTION_RATE = env_float("BATON_DEFAULT_INTERRUPTION_RATE", 0.9, minimum=0.0)

# Seconds a local instance takes to start; unset, each pool's own provisioning delay.
_delay = env_str("BATON_PROVISIONING_DELAY_S")
BATON_PROVISIONING_DELAY_S: float | None = (
    env_float("BATON_PROVISIONING_DELAY_S", 0.0, minimum=0.0) if _delay else None
)

# The market simulator (beat, migration/market_tick.py): 0 = off, nothing is preempted but by
# hand; N = N simulated seconds per wall second (3600: an hour a second). Spot pools preempt
# at their interruption rate, or replay the traces BATON_MARKET_TRACES names.
BATON_MARKET_TIME_SCALE = env_float("BATON_MARKET_TIME_SCALE", 0.0, minimum=0.0)
# The same variable as the beat entry's schedule: the service bounds a tick by it.
BATON_MARKET_TICK_SECONDS = env_float("BATON_MARKET_TICK_SECONDS", 1.0, minimum=0.1)
_market_seed = env_str("BATON_MARKET_SEED")
BATON_MARKET_SEED: int | None = env_int("BATON_MARKET_SEED", 0) if _market_seed else None


def _market_traces(name: str) -> list[tuple[str, Path]]:
    """Comma-separated entries, each `KEY=FILE` (KEY: a pool id, a zone or an instance type)
    or a bare file or folder of traces named `<zone>_<card>_<nodes>.json`, matched to spot
    pools by zone and card, else by region and card. Relative paths start at the project."""
    entries = []
    for entry in env_list(name, []):
        key, is_pair, raw = (part.strip() for part in entry.partition("="))
        if not is_pair:
            key, raw = "", key
        if is_pair and not (key and raw):
            raise ConfigError(f"{name}: {entry!r} is not KEY=FILE")
        path = Path(raw).expanduser()
        path = (path if path.is_absolute() else BASE_DIR / path).resolve()
        if not (path.is_file() or (not key and path.is_dir())):
            wanted = "trace file" if key else "trace file or folder"
            raise ConfigError(f"{name}: {entry!r}: no {wanted} at {path}")
        entries.append((key, path))
    return entries


BATON_MARKET_TRACES = _market_traces("BATON_MARKET_TRACES")

# --- the migration orchestrator ---------------------------------------------------------------
# What every local agent is told: how often to poll its metadata endpoint for notices and to
# send a heartbeat. An instance silent for BATON_HEARTBEAT_TIMEOUT_SECONDS is declared lost.
BATON_AGENT_POLL_SECONDS = env_float("BATON_AGENT_POLL_SECONDS", 0.5, minimum=0.05)
BATON_AGENT_HEARTBEAT_SECONDS = env_float("BATON_AGENT_HEARTBEAT_SECONDS", 5.0, minimum=0.1)
BATON_HEARTBEAT_TIMEOUT_SECONDS = env_float("BATON_HEARTBEAT_TIMEOUT_SECONDS", 30.0, minimum=1.0)
# A launched instance whose agent has not reported by then (after its provisioning delay) is
# declared failed to start and its job placed again.
BATON_START_TIMEOUT_SECONDS = env_float("BATON_START_TIMEOUT_SECONDS", 120.0, minimum=1.0)
# Restore validation: the restored loss must match the checkpoint's reference this closely.
BATON_VALIDATION_TOLERANCE = env_float("BATON_VALIDATION_TOLERANCE", 1e-4, minimum=0.0)
BATON_MAX_ROLLBACKS = env_int("BATON_MAX_ROLLBACKS", 2, minimum=0)
# Spot jobs that name no interval checkpoint every 5 minutes, as the seed advises.
BATON_DEFAULT_CHECKPOINT_SECONDS = env_int("BATON_DEFAULT_CHECKPOINT_SECONDS", 300, minimum=1)

# --- checkpoint stores, replication and retention ----------------------------------------------


def _region_pairs(name: str, schemes: tuple[str, ...]) -> dict[str, str]:
    """Comma-separated `REGION=URL` entries, each URL starting with one of `schemes`."""
    pairs: dict[str, str] = {}
    for entry in env_list(name, []):
        region, is_pair, url = (part.strip() for part in entry.partition("="))
        if not (is_pair and region and url):
            raise ConfigError(f"{name}: {entry!r} is not REGION=URL")
        if url.split("://", 1)[0] not in schemes or "://" not in url:
            wanted = ", ".join(f"{scheme}://" for scheme in schemes)
            raise ConfigError(f"{name}: {entry!r}: the URL must start with one of {wanted}")
        pairs[region] = url.rstrip("/")
    return pairs


# Each region's checkpoint store: a folder under BATON_STORE_ROOT unless named here
# (`us-east-1=s3://bucket/prefix,eu-west-1=file:///mnt/ckpt`); S3 endpoints per region, else
# BATON_S3_ENDPOINT, else AWS itself. Every job's checkpoints sit inside its project's folder.
BATON_REGION_STORES = _region_pairs("BATON_REGION_STORES", ("file", "s3"))
BATON_REGION_S3_ENDPOINTS = _region_pairs("BATON_REGION_S3_ENDPOINTS", ("http", "https"))
BATON_S3_ENDPOINT = env_str("BATON_S3_ENDPOINT")
# After a checkpoint commits, copies go to the K regions the job is most likely to land in next.
BATON_REPLICAS = env_int("BATON_REPLICAS", 2, minimum=0)
# Retention: the last N committed checkpoints of a job (plus its newest emergency one) are kept.
BATON_KEEP_CHECKPOINTS = env_int("BATON_KEEP_CHECKPOINTS", 3, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("BATON_LOG_LEVEL", "INFO")},
    "loggers": {"daphne": {"level": "WARNING"}, "django.channels.server": {"level": "WARNING"}},
}
