from django.urls import path

from apps.servers import views

app_name = "servers"
urlpatterns = [
    path("", views.server_list, name="list"),
    path("new/", views.server_new, name="new"),
    path("<uuid:pk>/", views.server_detail, name="detail"),
    path("<uuid:pk>/stop", views.server_stop, name="stop"),
    path("<uuid:pk>/restart", views.server_recover, {"action": "restart"}, name="restart"),
    path("<uuid:pk>/replace", views.server_recover, {"action": "replace"}, name="replace"),
    path("<uuid:pk>/delete", views.server_recover, {"action": "delete"}, name="delete"),
    path("<uuid:pk>/restart-policy", views.server_restart_policy, name="restart-policy"),
]
