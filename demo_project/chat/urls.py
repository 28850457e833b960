from django.urls import path

from . import views

app_name = "chat"

urlpatterns = [
    path("", views.index, name="index"),
    path("c/<int:pk>/", views.conversation, name="conversation"),
    path("c/<int:pk>/stop/", views.stop, name="stop"),
    path("c/<int:pk>/state/", views.state, name="state"),
    path("c/<int:pk>/official-client/", views.official_client, name="official_client"),
]
