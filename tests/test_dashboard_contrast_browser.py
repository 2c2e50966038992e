"""Every visible button on every dashboard page is readable (text colour differs from its background),
inline inputs do not stretch across the row, and an unknown address is the HTML 404 page in the layout."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from apps.artifacts.models import Artifact
from apps.clusters.models import Capability, Cluster, ClusterMember, ProjectLimits
from apps.clusters.tests.factories import loopback_node, running_server
from apps.embedding_migrations.models import ConsumerAlias, Cutover, EmbeddingSpace, VectorStore
from tests.fixtures import log_in

pytestmark = [pytest.mark.browser, pytest.mark.stack]

# Each visible button's text colour and its effective background (the first opaque one up the tree).
UNREADABLE_BUTTONS = """
() => {
  const opaque = (el) => {
    for (let node = el; node; node = node.parentElement) {
      const bg = getComputedStyle(node).backgroundColor;
      if (bg && bg !== 'transparent' && !bg.endsWith(', 0)')) return bg;
    }
    return 'rgb(255, 255, 255)';
  };
  return [...document.querySelectorAll('button, input[type=submit]')]
    .filter((b) => b.offsetParent !== null)
    .map((b) => ({
      text: (b.innerText || b.value).trim(), color: getComputedStyle(b).color, background: opaque(b),
    }))
    .filter((b) => b.color === b.background);
}
"""


@pytest.mark.django_db(transaction=True)
def test_no_visible_button_on_any_dashboard_page_is_text_on_its_own_colour(live_web, browser):
    # Regression: .card button{color:#fff} with .table button{background:#fff} painted Change the algorithm,
    # Detach, Save, Remove and Add a member white on white on the cluster page.
    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    node = loopback_node("rig-a")
    server = running_server(node, "embed-1", 9101)
    running_server(node, "embed-2", 9102)
    cluster = Cluster.objects.create(name="embed")
    ClusterMember.objects.create(cluster=cluster, name="attached", server=server)
    ClusterMember.objects.create(cluster=cluster, name="free", gpus=0)
    embedding = Capability.objects.create(name="rag.embedding@1")
    # An interrupted cut-over, so the Migrations page shows its progress and every action.
    space = EmbeddingSpace.objects.create(
        capability=embedding, model="m", dimension=8, normalized=True, recorded_by="test"
    )
    store = VectorStore.objects.create(name="kb-store", kind="pgvector", dsn="postgresql://x@127.0.0.1:1/x")
    query = Capability.objects.create(name="kb.query@1", follows=embedding)
    alias = ConsumerAlias.objects.create(
        store=store, name="kb", index="kb_v1", capability=embedding, query_capability=query
    )
    cutover = Cutover.objects.create(
        alias=alias,
        source_capability=embedding,
        target_capability=embedding,
        source_index="kb_v1",
        target_index="kb_v2",
        source_space={**space.identity(), "key": space.key},
        target_space={**space.identity(), "key": space.key},
        same_space=False,
        stage="cutting_over",
        interrupted_at=timezone.now(),
        docs_total=100,
        docs_done=40,
        created_by="test",
    )
    ready = Artifact.objects.create(name="ok", source_kind="http", locator="https://e.com/o", state="ready")
    held = Artifact.objects.create(
        name="held", source_kind="http", locator="https://e.com/h", state="quarantined"
    )
    # An unlocked cluster too, so Save, Remove and Attach all render.
    open_cluster = Cluster.objects.create(name="open")
    ClusterMember.objects.create(cluster=open_cluster, name="m1")
    defaults = ProjectLimits.objects.create(project="shop", requests_per_minute=3)
    pages = [
        "/",
        "/nodes/",
        f"/nodes/{node.pk}/",
        "/servers/",
        "/servers/new/",
        f"/servers/{server.pk}/",
        "/clusters/",
        f"/clusters/{cluster.pk}/",
        f"/clusters/{open_cluster.pk}/",
        "/clusters/playground/",
        "/clusters/project-limits/",
        f"/clusters/project-limits/{defaults.pk}/",
        "/artifacts/",
        f"/artifacts/{ready.pk}/",
        f"/artifacts/{held.pk}/",
        "/backups/",
        "/alerts/",
        "/work/",
        "/migrations/",
        f"/migrations/{cutover.pk}/",
        "/no/such/page",
    ]
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        log_in(page, live_web.url, "ops", "correct-horse-battery-9")
        unreadable: dict[str, list[dict[str, str]]] = {}
        counted = 0
        for path in pages:
            response = page.goto(live_web.url + path)
            assert response is not None and response.status == (404 if path == "/no/such/page" else 200), path
            counted += page.locator("button:visible").count()
            if found := page.evaluate(UNREADABLE_BUTTONS):
                unreadable[path] = found
        assert not unreadable, unreadable
        assert counted > 40  # the walk saw the buttons it is about, not empty pages

        page.goto(f"{live_web.url}/clusters/{open_cluster.pk}/")
        for label in ("Change the algorithm", "Save", "Remove", "Attach", "Add a member"):
            assert page.locator(f"button:has-text('{label}')").first.is_visible(), label
        weight = page.locator("input[aria-label='Weight of m1']").bounding_box()
        row = page.locator("#members table").bounding_box()
        assert (
            weight and row and weight["width"] < row["width"] / 4
        )  # inputs no longer stretch across the row

        # The interrupted cut-over: its progress bar at 40 %, the callout, and the three ways out.
        page.goto(f"{live_web.url}/migrations/{cutover.pk}/")
        for label in ("Retry the stage", "Complete", "Roll back"):
            assert page.locator(f"button:has-text('{label}')").first.is_visible(), label
        assert "CUTOVER_INTERRUPTED" in page.locator("[role=alert]").first.inner_text()
        bar = page.locator("[role=progressbar]").bounding_box()
        done = page.locator("[role=progressbar] .seg").bounding_box()
        assert bar and done and 0.35 < done["width"] / bar["width"] < 0.45

        page.goto(live_web.url + "/no/such/page")
        assert page.locator("h1").inner_text() == "Page not found"
        assert page.locator("nav.sidebar").is_visible()  # in the layout, for a logged-in operator
    finally:
        page.close()
