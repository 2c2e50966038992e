"""The dashboard's Playground: what an operator may try, and the short-lived credential the page calls the
gateway with.

The page sends its requests to ``/v1/*`` from the browser, exactly as a client would, so what it shows is
what a client gets (the routing, the limits, the refusals). It needs a client credential for that: a
*playground credential*, minted for one operator, one capability and one project, kind ``playground``
(labelled as such in the credential lists, the admin and the API), expiring after ``LIFETIME``.

1. The page asks ``credential_for`` (a Django view: operator session, CSRF) for the capability and project.
2. The credential this session minted for them is reused while it has at least ``REUSE_WHILE_LEFT`` to
   run and is still as minted (not revoked, same scope); its plain value is kept in the session only.
3. Otherwise a new one is minted. The gateway finds it at the first call: an unknown credential makes the
   gateway check its routing version before refusing (``router.caught_up``).
4. Logging out revokes the session's playground credentials; expired ones are left as they are (a row
   each, labelled, hidden from the Clusters page's list) so their usage keeps its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from apps.clusters.bindings import read_bindings
from apps.clusters.choices import CredentialKind
from apps.clusters.models import Capability, ClientCredential, digest
from apps.servers.profiles import ENDPOINT_PATHS

LIFETIME = timedelta(minutes=15)
REUSE_WHILE_LEFT = timedelta(minutes=2)
SESSION_KEY = "clusters.playground"
# The endpoints the page can send, in the order it offers them.
ENDPOINTS = ("chat", "completions", "embeddings")


@dataclass
class Offer:
    """A capability as the Playground offers it: the endpoints its running backends serve."""

    name: str
    description: str
    endpoints: list[str]
    running: int  # backends running now; 0: a call is refused (NO_ELIGIBLE_NODE), shown as such
    projects: list[str] = field(default_factory=list)  # "" first when an unbound tier exists

    def as_json(self) -> dict[str, Any]:
        return {"endpoints": self.endpoints, "running": self.running, "projects": self.projects}


def offers() -> list[Offer]:
    """Every capability, with the endpoints its running backends serve (every endpoint while none runs: the
    gateway's refusal then says why) and the projects its routing tiers are bound for."""
    bindings, _follows = read_bindings()
    paths = {path: name for name, path in ENDPOINT_PATHS.items()}
    found = []
    for capability in Capability.objects.order_by("name"):
        bound = bindings.get(capability.name, [])
        backends = [b for binding in bound for b in binding.backends]
        served = {paths[p] for b in backends for p in b.endpoints if p in paths}
        found.append(
            Offer(
                capability.name,
                capability.description,
                [e for e in ENDPOINTS if e in served] if backends else list(ENDPOINTS),
                len(backends),
                sorted({b.project for b in bound}) or [""],
            )
        )
    return found


@dataclass(frozen=True)
class Minted:
    credential: ClientCredential
    plain: str
    reused: bool

    def as_json(self) -> dict[str, Any]:
        c = self.credential
        return {
            "id": c.pk,
            "name": c.name,
            "credential": self.plain,
            "display_prefix": c.display_prefix,
            "capability": c.scopes[0],
            "project": c.project,
            "expires_at": c.expires_at.isoformat() if c.expires_at else None,
            "reused": self.reused,
        }


def credential_for(session: Any, user: Any, capability: str, project: str) -> Minted:
    """The session's playground credential for exactly ``capability`` (and ``project``): reused while it
    has ``REUSE_WHILE_LEFT`` to run, else a new one. The caller has checked that both are offered."""
    now = timezone.now()
    held: dict[str, dict[str, Any]] = session.get(SESSION_KEY) or {}
    key = f"{capability}|{project}"
    entry = held.get(key)
    if entry:
        credential = ClientCredential.objects.filter(
            pk=entry["id"], kind=CredentialKind.PLAYGROUND, revoked_at__isnull=True
        ).first()
        if (
            credential is not None
            and credential.secret_hash == digest(entry["plain"])
            and credential.scopes == [capability]
            and credential.project == project
            and credential.expires_at is not None
            and credential.expires_at - now >= REUSE_WHILE_LEFT
        ):
            return Minted(credential, entry["plain"], reused=True)
    credential, plain = ClientCredential.objects.mint(
        name=f"playground: {user.get_username()}"[:100],
        scopes=[capability],
        project=project,
        expires_at=now + LIFETIME,
        created_by=user,
        kind=CredentialKind.PLAYGROUND,
    )
    held[key] = {"id": credential.pk, "plain": plain}
    session[SESSION_KEY] = held
    return Minted(credential, plain, reused=False)


def revoke_session_credentials(session: Any) -> int:
    """Revoke the playground credentials ``session`` holds (at log-out); how many were still usable."""
    held: dict[str, dict[str, Any]] = session.get(SESSION_KEY) or {}
    revoked = 0
    for credential in ClientCredential.objects.filter(
        pk__in=[e["id"] for e in held.values()], kind=CredentialKind.PLAYGROUND, revoked_at__isnull=True
    ):
        revoked += credential.revoke()
    session.pop(SESSION_KEY, None)
    return revoked


def expired(credential: ClientCredential, now: datetime | None = None) -> bool:
    return credential.expires_at is not None and credential.expires_at <= (now or timezone.now())
