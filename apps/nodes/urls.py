from django.urls import path

from apps.nodes import views

app_name = "nodes"
urlpatterns = [
    path("", views.node_list, name="list"),
    path("enrollment-tokens/", views.token_list, name="tokens"),
    path("enrollment-tokens/<int:pk>/revoke", views.token_revoke, name="token-revoke"),
    path("mass-loss/confirm", views.mass_loss_confirm, name="mass-loss-confirm"),
    path("<uuid:pk>/", views.node_detail, name="detail"),
    path("<uuid:pk>/enable", views.node_set_enabled, {"enabled": True}, name="enable"),
    path("<uuid:pk>/disable", views.node_set_enabled, {"enabled": False}, name="disable"),
    path("<uuid:pk>/ping", views.node_ping, name="ping"),
]
