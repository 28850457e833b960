"""Django settings of the soak's worker and server processes: the demo's, with the database
aliases and PGSTREAMS overrides the coordinator passes in the environment (``SOAK_DATABASES``,
``SOAK_PGSTREAMS``: JSON). ``DATABASE_URL`` is the soak's own database."""

import json
import os

from demo_project.database import from_url
from demo_project.settings import *  # noqa: F403

DATABASES = {"default": from_url(os.environ["DATABASE_URL"])}
for _alias, _url in json.loads(os.environ.get("SOAK_DATABASES", "{}")).items():
    DATABASES[_alias] = from_url(_url)

PGSTREAMS = {**PGSTREAMS, **json.loads(os.environ.get("SOAK_PGSTREAMS", "{}"))}  # noqa: F405

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pgstreams": {"handlers": ["console"], "level": "ERROR"}},
}
