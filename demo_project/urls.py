from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("", include("demo_project.chat.urls")),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            extra_context={"demo_username": settings.DEMO_USERNAME, "demo_password": settings.DEMO_PASSWORD}
        ),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("pgstreams/", include("pgstreams.urls")),
    path("admin/", admin.site.urls),
]
