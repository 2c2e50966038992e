from django.urls import path

from apps.backups import views

app_name = "backups"
urlpatterns = [
    path("", views.backup_list, name="list"),
    path("now", views.backup_now, name="now"),
    path("<int:pk>/", views.backup_detail, name="detail"),
    path("<int:pk>/<str:action>", views.backup_action, name="action"),
    path("restores/<int:pk>/", views.restore_detail, name="restore"),
    path("restores/<int:pk>/<str:decision>", views.restore_review, name="review"),
]
