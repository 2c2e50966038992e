from django.urls import path

from apps.artifacts import views

app_name = "artifacts"
urlpatterns = [
    path("", views.artifact_list, name="list"),
    path("register", views.artifact_register, name="register"),
    path("<int:pk>/", views.artifact_detail, name="detail"),
    path("<int:pk>/<str:action>", views.artifact_action, name="action"),
]
