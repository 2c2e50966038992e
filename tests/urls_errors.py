"""A URLconf for the error-envelope tests: the real one plus views that fail on purpose."""

from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from modelforge.errors import ApiError


def explode(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("connection to postgres://modelforge:hunter2@db:5432 failed at /srv/app/x.py")


def refuse(request: HttpRequest) -> HttpResponse:
    raise ApiError("SOMETHING_REFUSED", "Refused on purpose; do the next step.", status=409)


class EchoSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=10)
    count = serializers.IntegerField(min_value=0)


class EchoView(APIView):
    def post(self, request: Request) -> Response:
        serializer = EchoSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response(serializer.validated_data)


class ExplodingApiView(APIView):
    def get(self, request: Request) -> Response:
        raise RuntimeError("SELECT secret FROM internals")


urlpatterns = [
    path("test/explode", explode),
    path("test/refuse", refuse),
    path("api/v1/test/echo", EchoView.as_view()),
    path("api/v1/test/explode", ExplodingApiView.as_view()),
    path("", include("modelforge.urls")),
]
