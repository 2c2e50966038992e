from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.clusters.models import CAPABILITY, Capability, ClientCredential, Cluster, ClusterMember, RoutingTier


def exact_capability(value: str) -> None:
    """Capabilities are matched exactly, so they are written exactly: no spaces, lower case, @version."""
    if not CAPABILITY.match(value):
        raise serializers.ValidationError(
            f"{value!r} is not name@version in lower case, e.g. rag.embedding@1."
        )


class CapabilitySerializer(serializers.ModelSerializer):
    name = serializers.CharField(max_length=80, validators=[exact_capability], trim_whitespace=False)

    class Meta:
        model = Capability
        fields = ["id", "name", "description"]


class ClusterMemberSerializer(serializers.ModelSerializer):
    class Meta:
        model = ClusterMember
        fields = ["id", "cluster", "name", "gpus", "weight", "server"]
        read_only_fields = ["server"]


class ClusterSerializer(serializers.ModelSerializer):
    members = ClusterMemberSerializer(many=True, read_only=True)
    servers_attached = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        fields = ["id", "name", "algorithm", "members", "servers_attached"]

    def get_servers_attached(self, cluster: Cluster) -> bool:
        return any(m.server_id for m in cluster.members.all())


class RoutingTierSerializer(serializers.ModelSerializer):
    class Meta:
        model = RoutingTier
        fields = ["id", "capability", "tier", "cluster", "server", "weight", "project"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        cluster = attrs.get("cluster", getattr(self.instance, "cluster", None))
        server = attrs.get("server", getattr(self.instance, "server", None))
        if (cluster is None) == (server is None):
            raise serializers.ValidationError(
                "Bind the tier to exactly one of a cluster or a standalone server."
            )
        return attrs


class ClientCredentialSerializer(serializers.ModelSerializer):
    scopes = serializers.ListField(
        child=serializers.CharField(max_length=80, validators=[exact_capability], trim_whitespace=False),
        allow_empty=False,
        max_length=100,
    )

    class Meta:
        model = ClientCredential
        fields = [
            "id",
            "name",
            "display_prefix",
            "scopes",
            "project",
            "created_at",
            "expires_at",
            "revoked_at",
        ]
        read_only_fields = ["display_prefix", "created_at", "revoked_at"]

    def mint(self, created_by: Any) -> tuple[ClientCredential, str]:
        """The credential and its plain value (shown once), from the validated data."""
        return ClientCredential.objects.mint(
            name=self.validated_data["name"],
            scopes=self.validated_data["scopes"],
            project=self.validated_data.get("project", ""),
            expires_at=self.validated_data.get("expires_at"),
            created_by=created_by,
        )


class MintedCredentialSerializer(ClientCredentialSerializer):
    credential = serializers.CharField(read_only=True, help_text="Shown once; only its digest is stored.")

    class Meta(ClientCredentialSerializer.Meta):
        fields = [*ClientCredentialSerializer.Meta.fields, "credential"]
