"""ModelForge settings: every value comes from a ``MODELFORGE_*`` environment variable.

Nothing here raises on a bad value. Problems are collected in ``MODELFORGE_CONFIG_PROBLEMS`` and
``modelforge.startup.enforce()`` reports them at every entry point (refusing to start in production).
docs/CONFIGURATION.md lists every setting.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import environ

from apps.servers.profiles import load_profiles
from modelforge import startup
from modelforge.config import SettingsReader

BASE_DIR = Path(__file__).resolve().parent.parent
RELEASE = "0.1.0"

read = SettingsReader()

MODELFORGE_ENV = read.choice("MODELFORGE_ENV", "development", ("development", "production"))
# A misspelt environment fails closed: it is judged as production, so the refusal names it.
PRODUCTION = MODELFORGE_ENV == "production" or any(p.setting == "MODELFORGE_ENV" for p in read.problems)
if PRODUCTION:
    MODELFORGE_ENV = "production"

MODELFORGE_HOME = Path(read.string("MODELFORGE_HOME", str(BASE_DIR / ".modelforge")) or "").resolve()
EMBEDDED_PG_PORT = read.integer("MODELFORGE_EMBEDDED_PG_PORT", 54329, minimum=1024, maximum=65535)
EMBEDDED_REDIS_PORT = read.integer("MODELFORGE_EMBEDDED_REDIS_PORT", 63799, minimum=1024, maximum=65535)

DEBUG = read.boolean("MODELFORGE_DEBUG", not PRODUCTION)
_secret_key = read.string("MODELFORGE_SECRET_KEY")
SECRET_KEY = _secret_key or startup.DEVELOPMENT_SECRET_KEY
ALLOWED_HOSTS = read.csv(
    "MODELFORGE_ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]"]
)
CSRF_TRUSTED_ORIGINS = read.csv("MODELFORGE_CSRF_TRUSTED_ORIGINS", [])
OPERATOR_API_KEY = read.string("MODELFORGE_OPERATOR_API_KEY")

# In development the embedded stack (`make run`) is the default; production names its stores.
_dev_database_url = None if PRODUCTION else f"postgres://postgres@127.0.0.1:{EMBEDDED_PG_PORT}/modelforge"
_dev_redis_url = None if PRODUCTION else f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
_database = read.database("MODELFORGE_DATABASE_URL", _dev_database_url)
REDIS_URL = read.url("MODELFORGE_REDIS_URL", _dev_redis_url, schemes=("redis", "rediss", "unix"))

HOST = read.string("MODELFORGE_HOST", "127.0.0.1")
PORT = read.integer("MODELFORGE_PORT", 8000, minimum=1, maximum=65535)
WEB_WORKERS = read.integer("MODELFORGE_WEB_WORKERS", 2, minimum=1, maximum=64)
BIND = read.string("MODELFORGE_BIND", f"{HOST}:{PORT}")
LOG_LEVEL: str = read.choice("MODELFORGE_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
DATA_UPLOAD_MAX_MEMORY_SIZE = read.integer("MODELFORGE_MAX_REQUEST_BYTES", 1_048_576, minimum=1024)
SECURE_COOKIES = read.boolean("MODELFORGE_SECURE_COOKIES", PRODUCTION)
CELERY_TASK_ALWAYS_EAGER = False

# Nodes: how often agents report, and when silence makes a node stale, then offline (CONFIGURATION.md
# explains the defaults: stale after three missed intervals plus a margin, so jitter never flaps).
HEARTBEAT_INTERVAL = read.integer("MODELFORGE_HEARTBEAT_INTERVAL", 10, minimum=1, maximum=300)
NODE_STALE_AFTER = read.integer("MODELFORGE_NODE_STALE_AFTER", 35, minimum=2, maximum=3600)
NODE_OFFLINE_AFTER = read.integer("MODELFORGE_NODE_OFFLINE_AFTER", 90, minimum=3, maximum=86400)
LIVENESS_SWEEP_INTERVAL = read.integer("MODELFORGE_LIVENESS_SWEEP_INTERVAL", 5, minimum=1, maximum=300)
# The control plane's own absence is not the nodes' (docs/CONFIGURATION.md, "Liveness"): a gap longer than
# this in the web processes' listening stamp or in the sweeps restarts every node's grace period.
LISTENING_GAP = read.integer("MODELFORGE_LISTENING_GAP", 20, minimum=3, maximum=3600)
# One sweep taking more than this share of online nodes offline at once (in a fleet of at least
# LIVENESS_MASS_LOSS_MIN_NODES) is suspected as the control plane's fault: held stale, one alert.
LIVENESS_MASS_LOSS_FRACTION = read.fraction("MODELFORGE_LIVENESS_MASS_LOSS_FRACTION", 0.5)
LIVENESS_MASS_LOSS_MIN_NODES = read.integer("MODELFORGE_LIVENESS_MASS_LOSS_MIN_NODES", 3, minimum=2)
ENROLLMENT_TOKEN_TTL = read.integer("MODELFORGE_ENROLLMENT_TOKEN_TTL", 3600, minimum=60, maximum=30 * 86400)
AGENT_CALL_TIMEOUT = read.integer("MODELFORGE_AGENT_CALL_TIMEOUT", 10, minimum=1, maximum=300)
CLUSTER_SECRET = read.string("MODELFORGE_CLUSTER_SECRET")

# Model servers: runtime profiles are manifests under config/runtimes (mounted in deployment).
CONFIG_DIR = Path(read.string("MODELFORGE_CONFIG_DIR", str(BASE_DIR / "config")) or "").resolve()
RUNTIME_PROFILES, _profile_problems = load_profiles(CONFIG_DIR)
for _problem in _profile_problems:
    read.problem(_problem.code, _problem.where, _problem.message)
# The node co-located with the control plane: the only one local-node-only servers (GGUF, encrypted
# weights) may run on. make run names its own node here.
LOCAL_NODE = read.string("MODELFORGE_LOCAL_NODE")
PLACEMENT_STRATEGY = read.choice("MODELFORGE_PLACEMENT_STRATEGY", "spread", ("spread", "pack"))
# The gateway's sin-bin (Envoy's outlier-detection defaults; docs/CONFIGURATION.md says why).
LB_CONSECUTIVE_FAILURES = read.integer("MODELFORGE_LB_CONSECUTIVE_FAILURES", 5, minimum=1, maximum=100)
LB_BASE_BENCH_S = read.integer("MODELFORGE_LB_BASE_BENCH_S", 30, minimum=1, maximum=3600)
LB_MAX_BENCH_S = read.integer("MODELFORGE_LB_MAX_BENCH_S", 300, minimum=1, maximum=86400)
LB_CHURN_WINDOW_S = read.integer("MODELFORGE_LB_CHURN_WINDOW_S", 600, minimum=10, maximum=86400)
LB_CHURN_THRESHOLD = read.integer("MODELFORGE_LB_CHURN_THRESHOLD", 3, minimum=2, maximum=100)
# Artifacts: the control plane's store and the supply-chain policy
# (docs/security/MODEL_SUPPLY_CHAIN_POLICY.md).
ARTIFACT_STORE = Path(read.string("MODELFORGE_ARTIFACT_STORE", str(MODELFORGE_HOME / "artifacts")) or "")
ARTIFACT_ALLOWED_SOURCES = read.csv("MODELFORGE_ARTIFACT_ALLOWED_SOURCES", ["local", "http", "huggingface"])
ARTIFACT_ALLOWED_HOSTS = read.csv("MODELFORGE_ARTIFACT_ALLOWED_HOSTS", [])
ARTIFACT_ALLOW_PICKLE = read.boolean("MODELFORGE_ARTIFACT_ALLOW_PICKLE", False)
ARTIFACT_MAX_BYTES = read.integer("MODELFORGE_ARTIFACT_MAX_BYTES", 200 * 2**30, minimum=1)
ARTIFACT_REQUIRE_LICENCE = read.boolean("MODELFORGE_ARTIFACT_REQUIRE_LICENCE", False)
ARTIFACT_TIMEOUT_S = read.integer("MODELFORGE_ARTIFACT_TIMEOUT_S", 30, minimum=1, maximum=3600)
ARTIFACT_HF_ENDPOINT = read.string("MODELFORGE_ARTIFACT_HF_ENDPOINT", "https://huggingface.co") or ""
# Backups (docs/operations/RUNBOOK_DATABASE_RESTORE.md): where snapshots go, when the newest verified one
# is stale (26 h: a daily schedule plus slack), retention, and PostgreSQL's tools of the server's major.
BACKUP_ROOT = Path(read.string("MODELFORGE_BACKUP_ROOT", str(MODELFORGE_HOME / "backups")) or "")
BACKUP_STALE_AFTER = read.integer("MODELFORGE_BACKUP_STALE_AFTER", 26 * 3600, minimum=60, maximum=90 * 86400)
BACKUP_KEEP = read.integer("MODELFORGE_BACKUP_KEEP", 7, minimum=1, maximum=10_000)
BACKUP_KEEP_DAYS = read.integer("MODELFORGE_BACKUP_KEEP_DAYS", 14, minimum=0, maximum=3650)
BACKUP_RESTORE_JOBS = read.integer("MODELFORGE_BACKUP_RESTORE_JOBS", 2, minimum=1, maximum=64)
BACKUP_MAINTENANCE_DATABASE = read.string("MODELFORGE_BACKUP_MAINTENANCE_DATABASE", "postgres") or "postgres"
PG_BIN_DIR = read.string("MODELFORGE_PG_BIN_DIR", "") or ""
# Failed servers come back: restart (or re-place, when their node is gone) with doubling back-off.
SERVER_RESTART_MAX_ATTEMPTS = read.integer(
    "MODELFORGE_SERVER_RESTART_MAX_ATTEMPTS", 5, minimum=0, maximum=100
)
SERVER_RESTART_BACKOFF = read.integer("MODELFORGE_SERVER_RESTART_BACKOFF", 10, minimum=1, maximum=3600)
SERVER_RESTART_BACKOFF_MAX = read.integer(
    "MODELFORGE_SERVER_RESTART_BACKOFF_MAX", 600, minimum=1, maximum=86400
)
SERVER_RECOVER_INTERVAL = read.integer("MODELFORGE_SERVER_RECOVER_INTERVAL", 5, minimum=1, maximum=300)
SERVER_START_TIMEOUT = read.integer("MODELFORGE_SERVER_START_TIMEOUT", 300, minimum=5, maximum=3600)

# Alert notifications: webhook and e-mail channels, delivered by the worker (apps/alerts/notify.py).
NOTIFY_INTERVAL = read.integer("MODELFORGE_NOTIFY_INTERVAL", 15, minimum=1, maximum=3600)
NOTIFY_TIMEOUT_S = read.integer("MODELFORGE_NOTIFY_TIMEOUT_S", 5, minimum=1, maximum=120)
NOTIFY_MAX_ATTEMPTS = read.integer("MODELFORGE_NOTIFY_MAX_ATTEMPTS", 8, minimum=1, maximum=100)
EMAIL_URL = read.url("MODELFORGE_EMAIL_URL", None, schemes=("smtp", "smtp+tls", "smtp+ssl"))
DEFAULT_FROM_EMAIL = read.string("MODELFORGE_EMAIL_FROM", "modelforge@localhost") or "modelforge@localhost"
if EMAIL_URL:  # django-environ reads smtp://, smtp+tls:// (STARTTLS) and smtp+ssl:// URLs
    _email = environ.Env.email_url_config(EMAIL_URL)
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = _email["EMAIL_HOST"] or ""
    EMAIL_PORT = _email["EMAIL_PORT"] or (465 if EMAIL_URL.startswith("smtp+ssl") else 25)
    EMAIL_HOST_USER = _email["EMAIL_HOST_USER"] or ""
    EMAIL_HOST_PASSWORD = _email["EMAIL_HOST_PASSWORD"] or ""
    EMAIL_USE_TLS = bool(_email.get("EMAIL_USE_TLS"))
    EMAIL_USE_SSL = bool(_email.get("EMAIL_USE_SSL"))
EMAIL_TIMEOUT = NOTIFY_TIMEOUT_S

MODELFORGE_CONFIG_PROBLEMS = startup.collect_problems(
    read,
    production=PRODUCTION,
    secret_key=_secret_key,
    debug=DEBUG,
    allowed_hosts=ALLOWED_HOSTS,
    operator_api_key=OPERATOR_API_KEY,
    cluster_secret=CLUSTER_SECRET,
    liveness=(HEARTBEAT_INTERVAL, NODE_STALE_AFTER, NODE_OFFLINE_AFTER),
    lb_bench=(LB_BASE_BENCH_S, LB_MAX_BENCH_S),
    database=_database,
    redis_url=REDIS_URL,
)

# --- Django -------------------------------------------------------------------------------------------

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "django_celery_beat",
    "apps.core",
    "apps.alerts",
    "apps.nodes",
    "apps.servers",
    "apps.clusters",
    "apps.artifacts",
    "apps.backups",
    "apps.observability",
]

MIDDLEWARE = [
    # Outermost: every request gets a correlation id, and every error response leaving the
    # application is rendered as the envelope, whoever produced it.
    "modelforge.middleware.CorrelationIdMiddleware",
    "modelforge.middleware.ErrorEnvelopeMiddleware",
    "modelforge.middleware.RequestSizeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Innermost: turns exceptions raised by views into envelopes (or the plain 500) before Django's
    # DEBUG pages can render them.
    "modelforge.middleware.ExceptionMiddleware",
]

ROOT_URLCONF = "modelforge.urls"
ASGI_APPLICATION = "modelforge.asgi.application"
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
                "modelforge.context_processors.navigation",
            ],
        },
    },
]

DATABASES = {
    "default": (
        _database
        if _database
        else {"ENGINE": "django.db.backends.postgresql", "NAME": "modelforge", "HOST": "127.0.0.1"}
    )
}
# Under ASGI every request runs in its own context, so Django's persistent connections would open one
# connection per request until PostgreSQL runs out; a psycopg pool per process bounds them instead.
DATABASE_POOL_SIZE = read.integer("MODELFORGE_DATABASE_POOL_SIZE", 10, minimum=1, maximum=500)
DATABASES["default"]["CONN_MAX_AGE"] = 0
# Each checkout proves its connection alive first (the pool's check): after a restore's switch-over or a
# database restart every pooled session is dead, and without the check each would fail one request.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("OPTIONS", {})
# A checkout waits at most 5 s: long enough to ride out a burst, short enough that /readyz and callers
# learn quickly that the database is gone.
DATABASES["default"]["OPTIONS"]["pool"] = {"min_size": 1, "max_size": DATABASE_POOL_SIZE, "timeout": 5}
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", 5)
DATABASES["default"]["OPTIONS"].setdefault("application_name", "modelforge")

# Monitoring history (telemetry samples) lives behind its own alias so that it can fail alone
# (OBSERVABILITY_DEGRADED). Unset, it is a second connection to the default database.
_observability = read.database("MODELFORGE_OBSERVABILITY_DATABASE_URL", None)
OBSERVABILITY_SHARES_DEFAULT = _observability is None
DATABASES["observability"] = {
    **(_observability or {k: v for k, v in DATABASES["default"].items() if k != "OPTIONS"}),
    "CONN_MAX_AGE": 0,
    # No pool, and a short connect timeout: a monitoring store that is gone must not hold a page for long.
    "OPTIONS": {"connect_timeout": 2, "application_name": "modelforge-observability"},
}
DATABASE_ROUTERS = ["modelforge.dbrouter.ObservabilityRouter"]
TELEMETRY_SAMPLE_INTERVAL = read.integer("MODELFORGE_TELEMETRY_SAMPLE_INTERVAL", 60, minimum=5, maximum=3600)
TELEMETRY_RETENTION_DAYS = read.integer("MODELFORGE_TELEMETRY_RETENTION_DAYS", 7, minimum=1, maximum=3650)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = MODELFORGE_HOME / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves the dashboard's and the admin's static files from the app directories, so no
# collectstatic step or separate file server is needed for this small set.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
# WhiteNoise hands Django a file iterator; under ASGI Django warns on every static file served.
warnings.filterwarnings("ignore", message="StreamingHttpResponse must consume synchronous iterators")

LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "dashboard:login"

SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
SESSION_COOKIE_HTTPONLY = True
CSRF_FAILURE_VIEW = "modelforge.middleware.csrf_failure"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

# A 500's body is fixed text; never let Django re-raise to the server, which could add its own.
DEBUG_PROPAGATE_EXCEPTIONS = False

# --- REST framework and OpenAPI -------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "modelforge.auth.OperatorKeyAuthentication",
        "modelforge.auth.StaffSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["modelforge.auth.IsOperator"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "modelforge.errors.drf_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "ModelForge API",
    "DESCRIPTION": "Operator API of the ModelForge control plane. Every error is the envelope "
    "{code, message, correlation_id}; docs/TROUBLESHOOTING.md explains each code.",
    "VERSION": RELEASE,
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["modelforge.auth.IsOperator"],
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "modelforge.openapi.declare_error_envelope",
    ],
}

# --- Celery ---------------------------------------------------------------------------------------------

CELERY_BROKER_URL = REDIS_URL or "redis://127.0.0.1:6379/0"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600, "socket_connect_timeout": 3}
CELERY_BEAT_SCHEDULER = "modelforge.beat:Scheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# The beat schedule is data; django-celery-beat copies it into its tables (editable in the admin).
# tests/test_celery.py proves every entry names a registered task.
CELERY_BEAT_SCHEDULE = {
    "record-worker-seen": {"task": "core.record_worker_seen", "schedule": 60.0},
    "sweep-node-liveness": {"task": "nodes.sweep_liveness", "schedule": float(LIVENESS_SWEEP_INTERVAL)},
    "ping-online-nodes": {"task": "nodes.ping_online_nodes", "schedule": 60.0},
    "reconcile-servers": {"task": "servers.reconcile", "schedule": 30.0},
    "recover-servers": {"task": "servers.recover", "schedule": float(SERVER_RECOVER_INTERVAL)},
    "check-capabilities": {"task": "clusters.check_capabilities", "schedule": float(SERVER_RECOVER_INTERVAL)},
    "clear-settled-churn": {"task": "clusters.clear_settled_churn", "schedule": 60.0},
    "backup-housekeeping": {"task": "backups.housekeeping", "schedule": 60.0},
    "notify-alerts": {"task": "alerts.notify", "schedule": float(NOTIFY_INTERVAL)},
    "sample-telemetry": {"task": "observability.sample", "schedule": float(TELEMETRY_SAMPLE_INTERVAL)},
}
# The backup schedule itself is a crontab row created by apps/backups/migrations (daily, 02:00 UTC) and
# edited in the admin: entries here are rewritten by beat at every start, admin edits would not last.

# --- Logging --------------------------------------------------------------------------------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"correlation": {"()": "modelforge.logging.CorrelationIdFilter"}},
    "formatters": {
        "standard": {
            "format": "%(asctime)s %(levelname)s [%(correlation_id)s] %(name)s: %(message)s",
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["correlation"],
            "formatter": "standard",
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.request": {"level": "ERROR", "propagate": True},
        "django.server": {"level": "WARNING", "propagate": True},
    },
}
