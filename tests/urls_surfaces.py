"""A URLconf with one forgotten guard per surface, for tests/test_surfaces.py to prove its checks fail."""

from django.http import HttpRequest, HttpResponse
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class OpenView(APIView):
    """An API view that forgot its permission."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    def get(self, request: Request, pk: int) -> Response:
        return Response({"id": pk})


def open_page(request: HttpRequest) -> HttpResponse:
    """A console page that forgot staff_member_required."""
    return HttpResponse("open")


urlpatterns = [
    path("api/v1/open/<int:pk>", OpenView.as_view(), name="open-api"),
    path("open/", open_page, name="open-page"),
]
