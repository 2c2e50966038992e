from django.urls import path

from apps.alerts import views

app_name = "alerts"
urlpatterns = [
    path("", views.alert_list, name="list"),
    path("channels/", views.channel_list, name="channels"),
    path("channels/create", views.channel_create, name="channel-create"),
    path("channels/<int:pk>/<str:action>", views.channel_action, name="channel-action"),
]
