from django.urls import path

from . import assistant, views

app_name = "chat"

urlpatterns = [
    path("", views.index, name="index"),
    path("c/<int:pk>/", views.conversation, name="conversation"),
    path("c/<int:pk>/stop/", views.stop, name="stop"),
    path("c/<int:pk>/state/", views.state, name="state"),
    path("c/<int:pk>/official-client/", views.official_client, name="official_client"),
    path("c/<int:pk>/htmx/", views.htmx, name="htmx"),
    path("c/<int:pk>/htmx2/", views.htmx, {"major": 2}, name="htmx2"),
    path("ai/", assistant.new_page, name="ai_new"),
    path("ai/c/<str:chat_id>/", assistant.page, name="ai_page"),
    path("ai/chat", assistant.chat, name="ai_chat"),
    path("ai/chat/<str:chat_id>/stream", assistant.resume, name="ai_resume"),
    path("ai/chat/<str:chat_id>/stop", assistant.stop, name="ai_stop"),
    path("ai/durable/chat", assistant.durable_chat, name="ai_durable_chat"),
    path("ai/durable/chat/<str:chat_id>/stream", assistant.durable_resume, name="ai_durable_resume"),
    path("ai/durable/chat/<str:chat_id>/stop", assistant.stop, name="ai_durable_stop"),
]
