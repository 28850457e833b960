"""Settings of the demo site, which is also the tests' Django project."""

import os
from pathlib import Path

import django

from .database import default_database

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "demo-only-not-secret"  # the demo serves loopback only
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "pgstreams",
    "django_tasks_db",  # the task backend generations are enqueued on, in the same database
    "demo_project.chat",
    "bench",  # manage.py pgstreams_bench: the benchmark, kept out of the installed app
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "demo_project.urls"
ASGI_APPLICATION = "demo_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DATABASES = {"default": default_database()}

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

PGSTREAMS = {}
# The Durable Streams endpoint (pgstreams/v1/stream/<path>) refuses every write by default. The
# conformance suite and the official client's test set DEMO_OPEN_DURABLE_STREAMS=1, which opens it
# to anyone, and shorten its long-polls so that the suite's timeouts test them.
# The benchmark reads each server's metrics with this token (METRICS_TOKEN: staff only otherwise).
if os.environ.get("DEMO_METRICS_TOKEN"):
    PGSTREAMS["METRICS_TOKEN"] = os.environ["DEMO_METRICS_TOKEN"]
if os.environ.get("DEMO_OPEN_DURABLE_STREAMS") == "1":
    PGSTREAMS["DURABLE_AUTHORIZE"] = "demo_project.chat.durable.allow_everything"
    PGSTREAMS["LONG_POLL_TIMEOUT"] = float(os.environ.get("DEMO_LONG_POLL_TIMEOUT", "2"))

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chat:index"
LOGOUT_REDIRECT_URL = "login"

# The fake LLM's pace.
CHAT_TOKENS_PER_SECOND = float(os.environ.get("CHAT_TOKENS_PER_SECOND", "30"))
# The demo user, created by `manage.py demo`; the login page shows these.
DEMO_USERNAME = "demo"
DEMO_PASSWORD = "demo"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pgstreams": {"handlers": ["console"], "level": "INFO"}},
}

# Django's Tasks API (django.tasks from 6.0; the django-tasks backport before), on a backend that
# keeps its tasks in the same database as the streams: a generation's stream and its task commit
# together (pgstreams.generations). Workers: python manage.py db_worker.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")
