from django.contrib.auth import views as auth_views
from django.urls import path

from apps.core import views

app_name = "dashboard"

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("work/", views.work_list, name="work"),
    path("work/<str:kind>/<str:pk>/retry", views.work_action, {"action": "retry"}, name="work-retry"),
    path("work/<str:kind>/<str:pk>/fail", views.work_action, {"action": "fail"}, name="work-fail"),
]
