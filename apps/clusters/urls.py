from django.urls import path

from apps.clusters import views

app_name = "clusters"
urlpatterns = [
    path("", views.cluster_list, name="list"),
    path("<int:pk>/", views.cluster_detail, name="detail"),
    path("create", views.cluster_create, name="create"),
    path("<int:pk>/algorithm", views.cluster_algorithm, name="algorithm"),
    path("<int:pk>/members/add", views.member_add, name="member-add"),
    path("members/<int:pk>/edit", views.member_edit, name="member-edit"),
    path("members/<int:pk>/remove", views.member_remove, name="member-remove"),
    path("members/<int:pk>/attach", views.member_attach, name="member-attach"),
    path("members/<int:pk>/detach", views.member_detach, name="member-detach"),
    path("capabilities/create", views.capability_create, name="capability-create"),
    path("tiers/create", views.tier_create, name="tier-create"),
    path("tiers/<int:pk>/remove", views.tier_remove, name="tier-remove"),
    path("credentials/mint", views.credential_mint, name="credential-mint"),
    path("credentials/<int:pk>/", views.credential_detail, name="credential-detail"),
    path("credentials/<int:pk>/limits", views.credential_limits, name="credential-limits"),
    path("project-limits/", views.project_limits_list, name="project-limits"),
    path("project-limits/create", views.project_limits_create, name="project-limits-create"),
    path("project-limits/<int:pk>/", views.project_limits_detail, name="project-limits-detail"),
    path("project-limits/<int:pk>/edit", views.project_limits_edit, name="project-limits-edit"),
    path("project-limits/<int:pk>/delete", views.project_limits_delete, name="project-limits-delete"),
    path("playground/", views.playground_page, name="playground"),
    path("playground/credential", views.playground_credential, name="playground-credential"),
    path("credentials/<int:pk>/revoke", views.credential_revoke, name="credential-revoke"),
]
