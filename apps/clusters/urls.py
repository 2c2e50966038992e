from django.urls import path

from apps.clusters import views

app_name = "clusters"
urlpatterns = [
    path("", views.cluster_list, name="list"),
    path("<int:pk>/", views.cluster_detail, name="detail"),
    path("credentials/mint", views.credential_mint, name="credential-mint"),
    path("credentials/<int:pk>/revoke", views.credential_revoke, name="credential-revoke"),
]
