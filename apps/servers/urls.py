from django.urls import path

from apps.servers import views

app_name = "servers"
urlpatterns = [
    path("", views.server_list, name="list"),
    path("new/", views.server_new, name="new"),
    path("<uuid:pk>/", views.server_detail, name="detail"),
    path("<uuid:pk>/stop", views.server_stop, name="stop"),
]
