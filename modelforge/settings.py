"""ModelForge settings: every value comes from a ``MODELFORGE_*`` environment variable.

Nothing here raises on a bad value. Problems are collected in ``MODELFORGE_CONFIG_PROBLEMS`` and
``modelforge.startup.enforce()`` reports them at every entry point (refusing to start in production).
docs/CONFIGURATION.md lists every setting.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from pathlib import Path

import environ

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
# How long the web process waits on a client (modelforge/http_protocol.py; docs/CONFIGURATION.md says why
# these defaults): idle between requests, for a request's headers, for its whole body, and for a client
# that reads nothing of an answer. None limits how long an answer takes: a long generation streams on.
HTTP_KEEPALIVE_S = read.integer("MODELFORGE_HTTP_KEEPALIVE_S", 5, minimum=1, maximum=3600)
HTTP_HEADER_TIMEOUT_S = read.integer("MODELFORGE_HTTP_HEADER_TIMEOUT_S", 10, minimum=1, maximum=300)
HTTP_BODY_TIMEOUT_S = read.integer("MODELFORGE_HTTP_BODY_TIMEOUT_S", 60, minimum=1, maximum=3600)
HTTP_SEND_TIMEOUT_S = read.integer("MODELFORGE_HTTP_SEND_TIMEOUT_S", 60, minimum=1, maximum=3600)
# The largest page an API list answers (``?limit=``); a larger limit is refused, not cut short.
API_MAX_PAGE_SIZE = read.integer("MODELFORGE_API_MAX_PAGE_SIZE", 500, minimum=1, maximum=10_000)
SECURE_COOKIES = read.boolean("MODELFORGE_SECURE_COOKIES", PRODUCTION)
CELERY_TASK_ALWAYS_EAGER = False
# Log-in throttling (django-axes): this many failed passwords for one username from one address lock that
# pair out for the cool-off (seconds). The API counts failed credentials per address in Redis
# (modelforge.auththrottle): the failure that reaches the limit blocks the address for the window.
LOGIN_FAILURE_LIMIT = read.integer("MODELFORGE_LOGIN_FAILURE_LIMIT", 5, minimum=1, maximum=1000)
LOGIN_COOLOFF = read.integer("MODELFORGE_LOGIN_COOLOFF", 900, minimum=1, maximum=7 * 86400)
API_AUTH_FAILURE_LIMIT = read.integer("MODELFORGE_API_AUTH_FAILURE_LIMIT", 10, minimum=1, maximum=10_000)
API_AUTH_FAILURE_WINDOW = read.integer("MODELFORGE_API_AUTH_FAILURE_WINDOW", 300, minimum=1, maximum=86400)
# The proxies whose X-Forwarded-For (the client's address) and X-Forwarded-Proto are believed: none unless
# listed, in development too (modelforge/proxies.py; docs/CONFIGURATION.md, "Behind a proxy").
TRUSTED_PROXIES = read.networks("MODELFORGE_TRUSTED_PROXIES", [])

# Nodes: how often agents report, and when silence makes a node stale, then offline (CONFIGURATION.md
# explains the defaults: stale after three missed intervals plus a margin, so jitter never flaps).
HEARTBEAT_INTERVAL = read.integer("MODELFORGE_HEARTBEAT_INTERVAL", 10, minimum=1, maximum=300)
# Engine signals (running, waiting, KV cache) arrive with heartbeats; older than this they are not acted on
# (apps/nodes/engine_signals.py). Default: two intervals, so one late heartbeat does not blank them.
ENGINE_SIGNALS_MAX_AGE_S = read.integer(
    "MODELFORGE_ENGINE_SIGNALS_MAX_AGE_S", 2 * HEARTBEAT_INTERVAL, minimum=1, maximum=3600
)
NODE_STALE_AFTER = read.integer("MODELFORGE_NODE_STALE_AFTER", 35, minimum=2, maximum=3600)
NODE_OFFLINE_AFTER = read.integer("MODELFORGE_NODE_OFFLINE_AFTER", 90, minimum=3, maximum=86400)
LIVENESS_SWEEP_INTERVAL = read.integer("MODELFORGE_LIVENESS_SWEEP_INTERVAL", 5, minimum=1, maximum=300)
# The control plane's own absence is not the nodes' (docs/CONFIGURATION.md, "Liveness"): a gap longer than
# this in the web processes' listening stamp or in the sweeps restarts every node's grace period.
LISTENING_GAP = read.integer("MODELFORGE_LISTENING_GAP", 20, minimum=3, maximum=3600)
# Off only for a test harness whose web process shares a database with tests that move the clock; a
# control plane without the stamps cannot tell its own absence from its nodes' (refused in production).
LISTENING_STAMPS = read.boolean("MODELFORGE_LISTENING_STAMPS", True)
# Both are judged by the nodes app's system checks (nodes.E003, nodes.E004: apps/nodes/checks.py).
# One sweep taking more than this share of online nodes offline at once (in a fleet of at least
# LIVENESS_MASS_LOSS_MIN_NODES) is suspected as the control plane's fault: held stale, one alert.
LIVENESS_MASS_LOSS_FRACTION = read.fraction("MODELFORGE_LIVENESS_MASS_LOSS_FRACTION", 0.5)
LIVENESS_MASS_LOSS_MIN_NODES = read.integer("MODELFORGE_LIVENESS_MASS_LOSS_MIN_NODES", 3, minimum=2)
ENROLLMENT_TOKEN_TTL = read.integer("MODELFORGE_ENROLLMENT_TOKEN_TTL", 3600, minimum=60, maximum=30 * 86400)
AGENT_CALL_TIMEOUT = read.integer("MODELFORGE_AGENT_CALL_TIMEOUT", 10, minimum=1, maximum=300)
CLUSTER_SECRET = read.string("MODELFORGE_CLUSTER_SECRET")

# Model servers: runtime profiles are manifests under config/runtimes (mounted in deployment). The
# servers app loads and validates them when it is ready (apps/servers/apps.py): their problems join
# MODELFORGE_CONFIG_PROBLEMS before any entry point checks it.
CONFIG_DIR = Path(read.string("MODELFORGE_CONFIG_DIR", str(BASE_DIR / "config")) or "").resolve()
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
# The gateway's admission queue, for backends whose runtime profile sets max_concurrent
# (apps/gateway/admission.py; docs/CONFIGURATION.md says why these defaults).
GATEWAY_QUEUE_MAX_WAITING = read.integer(
    "MODELFORGE_GATEWAY_QUEUE_MAX_WAITING", 100, minimum=1, maximum=100000
)
GATEWAY_QUEUE_DEADLINE_S = read.integer("MODELFORGE_GATEWAY_QUEUE_DEADLINE_S", 30, minimum=1, maximum=600)
# The gateway's probes of its backends (apps/gateway/probe.py; docs/CONFIGURATION.md says why).
GATEWAY_PROBE_EVERY_S = read.integer("MODELFORGE_GATEWAY_PROBE_EVERY_S", 2, minimum=1, maximum=60)
GATEWAY_PROBE_TIMEOUT_MS = read.integer(
    "MODELFORGE_GATEWAY_PROBE_TIMEOUT_MS", 1000, minimum=50, maximum=30000
)
GATEWAY_PROBE_FAILURES = read.integer("MODELFORGE_GATEWAY_PROBE_FAILURES", 2, minimum=1, maximum=10)
# Prefix-affinity routing (apps/gateway/affinity.py; docs/CONFIGURATION.md says why these defaults).
GATEWAY_PREFIX_CHARS = read.integer("MODELFORGE_GATEWAY_PREFIX_CHARS", 1024, minimum=16, maximum=65536)
GATEWAY_AFFINITY_LOAD_CAP_PCT = read.integer(
    "MODELFORGE_GATEWAY_AFFINITY_LOAD_CAP_PCT", 125, minimum=100, maximum=1000
)
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
# The only folders a local source may be read from (apps/artifacts/local_roots.py); empty: none. make run
# sets <home>/imports. Never the data folder, its secrets, the store, the backups or the agent's state.
ARTIFACT_LOCAL_ROOTS = read.paths("MODELFORGE_ARTIFACT_LOCAL_ROOTS")
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
# Outages of the platform's own processes and stores (apps/alerts/outages.py): every web process checks the
# database, the broker and the worker's and beat's stamps this often; a worker or beat silent for longer
# than its limit is WORKER_MISSING / BEAT_MISSING. The worker is probed, and beat stamps, at least three
# times per limit (at most every 60 s and 15 s), so one late probe never raises them.
OUTAGE_CHECK_INTERVAL = read.integer("MODELFORGE_OUTAGE_CHECK_INTERVAL", 10, minimum=1, maximum=300)
WORKER_MISSING_AFTER = read.integer("MODELFORGE_WORKER_MISSING_AFTER", 180, minimum=5, maximum=86400)
BEAT_MISSING_AFTER = read.integer("MODELFORGE_BEAT_MISSING_AFTER", 120, minimum=5, maximum=86400)
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
    "drf_spectacular_sidecar",  # Swagger UI's files for /api/v1/docs/, served locally (no CDN)
    "django_celery_beat",
    "axes",
    "apps.core",
    "apps.alerts",
    "apps.nodes",
    "apps.servers",
    "apps.clusters",
    "apps.artifacts",
    "apps.backups",
    "apps.observability",
    "apps.embedding_migrations",
    "apps.gateway",  # the serving data path (/v1/), above the configuration it routes by
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
    # Replaces a locked-out log-in's response with the lockout page (AXES_LOCKOUT_CALLABLE).
    "axes.middleware.AxesMiddleware",
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
# Usage per credential (apps/gateway/usage.py), per minute on the observability alias.
USAGE_RETENTION_DAYS = read.integer("MODELFORGE_USAGE_RETENTION_DAYS", 90, minimum=1, maximum=3650)
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

# django-axes guards the dashboard's and the admin's log-in forms (docs/DECISIONS.md says why these
# choices). Its backend goes first: a locked-out pair is refused before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(seconds=LOGIN_COOLOFF)
# Username and address together: an attacker elsewhere cannot lock the operator out, and one address
# cannot try more than the limit against any one account.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# Attempts refused during a lockout are not counted: the time the lockout page gives stays true.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "apps.core.views.login_locked_out"

SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
SESSION_COOKIE_HTTPONLY = True
CSRF_FAILURE_VIEW = "modelforge.middleware.csrf_failure"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# Strict-Transport-Security on answers to HTTPS requests (a year in production; 0 sends none). Django
# adds it only to a request it sees as secure: behind a proxy that terminates TLS, the proxy sets it.
SECURE_HSTS_SECONDS = read.integer(
    "MODELFORGE_HSTS_SECONDS", 31_536_000 if PRODUCTION else 0, minimum=0, maximum=63_072_000
)
# includeSubDomains covers names under the one ModelForge answers to, not its siblings; preload only
# allows a submission to browsers' preload list (nothing submits it).
SECURE_HSTS_INCLUDE_SUBDOMAINS = read.boolean("MODELFORGE_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION)
SECURE_HSTS_PRELOAD = read.boolean("MODELFORGE_HSTS_PRELOAD", PRODUCTION)
# No redirect to HTTPS here (security.W008, `check --deploy`): TLS ends at the proxy in front, which
# redirects; agents, the load balancer's /healthz and /readyz and Compose's own network reach the web
# process over plain HTTP, and a redirect would break every one of them.
SILENCED_SYSTEM_CHECKS = ["security.W008"]

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
    # DRF's JSON parser with the nesting depth and NUL characters bounded (JSON_TOO_DEEP, VALIDATION_ERROR).
    "DEFAULT_PARSER_CLASSES": ["modelforge.parsers.BoundedJSONParser"],
    "DEFAULT_FILTER_BACKENDS": ["modelforge.filters.FilterBackend"],
    # limit 1..API_MAX_PAGE_SIZE, offset 0..bigint: out of range is a 400 naming the parameter.
    "DEFAULT_PAGINATION_CLASS": "modelforge.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "modelforge.errors.drf_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "modelforge.autoschema.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "ModelForge API",
    "DESCRIPTION": "Operator API of the ModelForge control plane. Every error is the envelope "
    "{code, message, correlation_id}; docs/TROUBLESHOOTING.md explains each code.",
    "VERSION": RELEASE,
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["modelforge.auth.IsOperator"],
    # The API browser (/api/v1/docs/) loads Swagger UI from drf-spectacular-sidecar's static files.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # One stable name per choice set shared by several fields (without them the schema has hashed names
    # such as State8eeEnum, and `check --deploy` warns: drf_spectacular.W001).
    "ENUM_NAME_OVERRIDES": {
        "ServerStateEnum": "apps.servers.choices.ServerState",
        "CredentialKindEnum": "apps.clusters.choices.CredentialKind",
        "SeverityEnum": "apps.alerts.choices.Severity",
        "RestorePhaseNameEnum": "apps.backups.choices.RestorePhaseName",
    },
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
# Work is never stranded (apps.core.work): a waiting row's task is re-sent after WORK_RESEND_AFTER, and it
# raises WORK_STUCK after WORK_STUCK_AFTER (long tasks: acquisitions, verifications, WORK_LONG_TASK_BOUND).
WORK_WATCH_INTERVAL = read.integer("MODELFORGE_WORK_WATCH_INTERVAL", 30, minimum=5, maximum=3600)
WORK_RESEND_AFTER = read.integer("MODELFORGE_WORK_RESEND_AFTER", 60, minimum=10, maximum=86400)
WORK_STUCK_AFTER = read.integer("MODELFORGE_WORK_STUCK_AFTER", 600, minimum=30, maximum=7 * 86400)
WORK_LONG_TASK_BOUND = read.integer(
    "MODELFORGE_WORK_LONG_TASK_BOUND", 6 * 3600, minimum=60, maximum=7 * 86400
)
# Embedding migrations: the gateway a reindex embeds through (as a client, with a credential scoped to the
# target capability), and how long a running stage may go without progress before it is interrupted.
GATEWAY_URL = read.url("MODELFORGE_GATEWAY_URL", "http://127.0.0.1:8000", schemes=("http", "https"))
CUTOVER_STALL_AFTER = read.integer("MODELFORGE_CUTOVER_STALL_AFTER", 120, minimum=2, maximum=86400)
# The Celery queue of cutover runs: "celery" (the default queue), or a queue of its own so that long
# reindexes run on workers started with -Q NAME and never delay placements or recoveries.
CUTOVER_QUEUE = read.string("MODELFORGE_CUTOVER_QUEUE", "celery")
# Redis re-delivers an unacknowledged task after the visibility timeout even while it still runs, so it
# must be longer than the longest task (a restore or acquisition of hours); the watchdog, not
# re-delivery, is what recovers work from a killed worker.
# A broker that holds its connections open and answers nothing (a frozen Redis, a half-open connection)
# must not hold a request: every connect and every reply is bounded by BROKER_TIMEOUT_S, after which the
# publish fails like a refused connection and the row is left to the watchdog (modelforge/dispatch.py).
# kombu recommends socket_timeout for exactly this; without it a publish waits as long as the freeze.
BROKER_TIMEOUT_S = read.integer("MODELFORGE_BROKER_TIMEOUT_S", 1, minimum=1, maximum=60)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": WORK_LONG_TASK_BOUND * 2,
    "socket_connect_timeout": BROKER_TIMEOUT_S,
    "socket_timeout": BROKER_TIMEOUT_S,
}
CELERY_BEAT_SCHEDULER = "modelforge.beat:Scheduler"
# Several beats: one holds a PostgreSQL advisory lock and schedules; the others wait as standbys and try the
# lock this often, which bounds the takeover after the leader dies (modelforge/beat.py, docs/RELIABILITY.md).
BEAT_STANDBY_RETRY_S = read.integer("MODELFORGE_BEAT_STANDBY_RETRY_S", 5, minimum=1, maximum=60)
# Write each entry's last_run_at as soon as it is sent (django-celery-beat's default: every ~3 minutes), so
# a beat taking over finds the old leader's bookkeeping current and does not find every entry due at once.
CELERY_BEAT_SYNC_EVERY = 1
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
    "watch-work": {"task": "core.watch_work", "schedule": float(WORK_WATCH_INTERVAL)},
    "clear-settled-churn": {"task": "clusters.clear_settled_churn", "schedule": 60.0},
    "backup-housekeeping": {"task": "backups.housekeeping", "schedule": 60.0},
    "notify-alerts": {"task": "alerts.notify", "schedule": float(NOTIFY_INTERVAL)},
    "sample-telemetry": {"task": "observability.sample", "schedule": float(TELEMETRY_SAMPLE_INTERVAL)},
    "watch-cutovers": {"task": "embedding_migrations.watch", "schedule": 15.0},
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

# Last, once every setting above has been read: a MODELFORGE_* name that no reading asked for is a
# misspelling or a leftover (UNKNOWN_SETTING), refused in production like every other problem.
read.report_unknown()
