from django.urls import path

from apps.alerts import views

app_name = "alerts"
urlpatterns = [path("", views.alert_list, name="list")]
