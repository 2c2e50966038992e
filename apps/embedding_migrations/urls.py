from django.urls import path

from apps.embedding_migrations import views

app_name = "migrations"
urlpatterns = [
    path("", views.cutover_list, name="list"),
    path("plan", views.plan_cutover, name="plan"),
    path("<uuid:pk>/", views.cutover_detail, name="detail"),
    path("<uuid:pk>/<str:action>", views.cutover_action, name="action"),
]
