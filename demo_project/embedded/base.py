"""Django's PostgreSQL backend on the embedded server, which the first connection starts."""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from demo_project.database import start_embedded


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        if not self.settings_dict["HOST"]:
            # Filled in place: whoever reads this alias's settings later (other processes'
            # connection strings, pgstreams' own connections) sees where the server is.
            self.settings_dict["HOST"], self.settings_dict["PORT"] = start_embedded()
        return super().get_connection_params()
