from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "demo_project.chat"
    label = "chat"
    default_auto_field = "django.db.models.BigAutoField"
