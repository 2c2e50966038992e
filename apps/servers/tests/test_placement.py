"""The scheduler: refusals by name with every node's numbers; external pressure and reservations
counted; stale telemetry refuses; locality; concurrent placements never overcommit a GPU."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.nodes.tests.factories import GIB
from apps.servers.models import ModelServer, Reservation
from apps.servers.scheduler import PlacementRefused, Request, place
from apps.servers.tests.factories import cpu_node, gpu_node, gpu_request
from modelforge.errors import ApiError

pytestmark = pytest.mark.django_db


def placed_on(server: ModelServer) -> str:
    assert server.node is not None
    return server.node.name


def refused(request: Request) -> PlacementRefused:
    with pytest.raises(PlacementRefused) as caught:
        place(request)
    return caught.value


def test_no_node_at_all_is_no_eligible_node_503():
    refusal = refused(gpu_request())
    assert (refusal.code, refusal.status) == ("NO_ELIGIBLE_NODE", 503)
    assert "no node is enrolled" in refusal.message


def test_every_ineligible_node_is_named_with_its_reason(settings):
    gpu_node("off", [(24, 0, 0)], enabled=False)
    cpu_node("cpu-only")
    stale = gpu_node("old", [(24, 0, 0)])
    with time_machine.travel(timezone.now() + timedelta(seconds=settings.NODE_STALE_AFTER + 5), tick=False):
        gpu_node("fresh-but-disabled", [(24, 0, 0)], enabled=False)
        refusal = refused(gpu_request())
    assert refusal.code == "NO_ELIGIBLE_NODE"
    reasons = {v.node: v.reason for v in refusal.verdicts}
    assert reasons["off"] == "disabled"
    assert reasons["fresh-but-disabled"] == "disabled"
    assert reasons["cpu-only"].startswith("stale telemetry") or "accelerator cpu" in reasons["cpu-only"]
    assert reasons[stale.name].startswith("stale telemetry: last heartbeat")
    assert "[old] stale telemetry" in refusal.message


def test_a_wrong_accelerator_is_explained():
    cpu_node("cpu-only")
    refusal = refused(gpu_request())
    assert refusal.verdicts[0].reason == "accelerator cpu, profile test-echo-gpu needs nvidia"


def test_external_pressure_counts_and_the_refusal_gives_the_numbers():
    # 24 GiB GPU; 20 GiB used, of which only 2 GiB are ModelForge's: 18 GiB of external pressure.
    gpu_node("rig", [(24, 20, 2)])
    refusal = refused(gpu_request(weights_gib=4))  # needs 1.2 x 4 + 1 = 5.8 GiB
    assert (refusal.code, refusal.status) == ("CAPACITY_CONSTRAINED", 409)
    assert (
        "[rig] 0 of 1 GPU(s) have 5.8 GiB free, 1 needed (1.2 x 4.0 GiB of weights + 1.0 GiB overhead)"
        in (refusal.message)
    )
    assert "GPU 0: 24.0 GiB total - 20.0 GiB used - 0.0 GiB reserved = 4.0 GiB" in refusal.message
    assert not ModelServer.objects.exists()


def test_reservations_count_until_a_heartbeat_reflects_them():
    gpu_node("rig", [(24, 2, 0)])
    first = place(gpu_request("a", weights_gib=7.5))  # 10 GiB
    second = place(gpu_request("b", weights_gib=7.5))  # 22 - 10 = 12 >= 10
    assert first.state == second.state == "starting"
    refusal = refused(gpu_request("c", weights_gib=7.5))  # 22 - 20 = 2 < 10
    assert "- 20.0 GiB reserved = 2.0 GiB" in refusal.message
    assert Reservation.objects.count() == 2


def test_a_placed_server_is_recorded_starting_with_both_moves_and_its_reservation():
    gpu_node("rig", [(24, 2, 0), (24, 10, 0)])
    server = place(gpu_request("recorded", weights_gib=4))
    server.refresh_from_db()
    assert (server.state, placed_on(server)) == ("starting", "rig")
    moves = list(server.events.order_by("id").values_list("from_state", "to_state", "detail"))
    assert [(before, to) for before, to, _ in moves] == [("pending", "placing"), ("placing", "starting")]
    assert moves[0][2].startswith("placing on rig: fits on GPU(s) 0")
    assert moves[1][2] == "reserved 5.8 GiB x 1 on rig"
    assert list(Reservation.objects.filter(server=server).values_list("gpu__index", flat=True)) == [0]


def test_the_ranking_sees_reservations_and_looks_past_the_runners_up(settings):
    # Regression guard: the ranking reads the whole fleet in SQL but returns only the best few nodes; the
    # best must come out whatever its name, with reservations subtracted before ranking.
    settings.PLACEMENT_STRATEGY = "spread"
    for i in range(14):
        gpu_node(f"a-{i:02d}", [(24, 4, 0)])
    gpu_node("z-roomiest", [(48, 0, 0)])
    assert placed_on(place(gpu_request("first", weights_gib=19))) == "z-roomiest"  # 23.8 GiB reserved
    assert placed_on(place(gpu_request("second", weights_gib=4))) == "z-roomiest"  # 24.2 left > 20
    assert placed_on(place(gpu_request("third", weights_gib=4))) == "a-00"  # 18.4 left < 20: then by name


def test_a_disabled_or_stale_node_is_never_chosen(settings):
    gpu_node("disabled-but-empty", [(80, 0, 0)], enabled=False)
    gpu_node("busy", [(24, 10, 0)])
    server = place(gpu_request())
    assert placed_on(server) == "busy"
    with time_machine.travel(timezone.now() + timedelta(seconds=settings.NODE_STALE_AFTER + 1), tick=False):
        assert refused(gpu_request("later")).code == "NO_ELIGIBLE_NODE"


def test_locality_wins_then_spread_or_pack(settings):
    gpu_node("roomy", [(80, 0, 0)], models=["m2"])
    gpu_node("has-model", [(24, 0, 0)], models=["m1", "m2"])
    gpu_node("snug", [(16, 0, 0)], models=["m2"])
    assert placed_on(place(gpu_request("local", model="m1"))) == "has-model"
    settings.PLACEMENT_STRATEGY = "spread"
    assert placed_on(place(gpu_request("spread", model="m2"))) == "roomy"
    settings.PLACEMENT_STRATEGY = "pack"
    assert placed_on(place(gpu_request("pack", model="m2"))) == "snug"


def test_multi_gpu_placement_takes_distinct_gpus_on_one_node():
    gpu_node("quad", [(24, 0, 0), (24, 20, 0), (24, 0, 0), (24, 1, 0)])
    server = place(gpu_request(gpus=3, weights_gib=24))  # 1.2 x 8 + 1 = 10.6 GiB per GPU
    indexes = sorted(Reservation.objects.filter(server=server).values_list("gpu__index", flat=True))
    assert indexes == [0, 2, 3]
    assert refused(gpu_request("five", gpus=5)).code == "CAPACITY_CONSTRAINED"


def test_too_little_shared_memory_is_refused_by_its_key():
    gpu_node("small-shm", [(80, 0, 0)], shm_gib=4)
    refusal = refused(Request(name="v", profile="vllm", model="m", gpus=1, weights_bytes=8 * GIB))
    assert (refusal.code, refusal.status) == ("insufficient_shared_memory", 409)
    assert "/dev/shm is 4.0 GiB, the profile needs 8.0 GiB" in refusal.message
    assert "must be recreated" in refusal.message


def test_gguf_servers_are_local_node_only(settings):
    cpu_node("remote-cpu")
    request = Request(name="g", profile="llamacpp-gguf", model="gemma", weights_bytes=GIB)
    with pytest.raises(ApiError) as caught:
        place(request)
    assert (caught.value.code, caught.value.status) == ("llamacpp_remote_unsupported", 409)
    assert "GGUF servers are local-node only. Deploy locally." in caught.value.message

    settings.LOCAL_NODE = "local-cpu"
    cpu_node("local-cpu")
    pinned = Request(name="g2", profile="llamacpp-gguf", model="gemma", weights_bytes=GIB, node="remote-cpu")
    with pytest.raises(ApiError) as caught:
        place(pinned)
    assert caught.value.code == "llamacpp_remote_unsupported"
    assert (
        placed_on(place(Request(name="g3", profile="llamacpp-gguf", model="gemma", weights_bytes=GIB)))
        == "local-cpu"
    )


def test_encrypted_weights_are_local_node_only(settings):
    gpu_node("remote", [(24, 0, 0)])
    with pytest.raises(ApiError) as caught:
        place(gpu_request(encrypted=True))
    assert caught.value.code == "encrypted_weights_local_only"
    settings.LOCAL_NODE = "remote"
    assert placed_on(place(gpu_request("enc", encrypted=True))) == "remote"


def test_cpu_servers_are_placed_by_available_ram():
    cpu_node("tight", available_gib=0)
    cpu_node("free", available_gib=8)
    server = place(Request(name="echo", profile="test-echo", model="m"))
    assert placed_on(server) == "free"
    assert Reservation.objects.get(server=server).gpu is None


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (Request(name="x", profile="nope", model="m"), "UNKNOWN_RUNTIME_PROFILE"),
        (Request(name="x", profile="test-echo", model="m", gpus=1), "VALIDATION_ERROR"),
        (
            Request(name="x", profile="test-echo-gpu", model="m", gpus=0, weights_bytes=GIB),
            "VALIDATION_ERROR",
        ),
        (Request(name="x", profile="test-echo-gpu", model="m", gpus=1), "VALIDATION_ERROR"),
    ],
)
def test_bad_requests_are_400s(request_, code):
    with pytest.raises(ApiError) as caught:
        place(request_)
    assert (caught.value.code, caught.value.status) == (code, 400)


def test_the_decision_takes_the_same_number_of_queries_for_any_number_of_nodes():
    # Regression guard: placement must not query per node.
    def queries_for(count: int, prefix: str) -> int:
        for i in range(count):
            gpu_node(f"{prefix}-{i}", [(24, 0, 0)] * 2)
        with CaptureQueriesContext(connection) as captured:
            place(gpu_request(f"{prefix}-srv"))
        return len(captured.captured_queries)

    assert queries_for(2, "few") == queries_for(30, "many")


@pytest.mark.django_db(transaction=True)
def test_concurrent_placements_never_overcommit_a_gpu(monkeypatch):
    # Placement alone: a worker running elsewhere in the suite would start (and, with no agent, fail)
    # these servers, releasing their reservations mid-race.
    from apps.servers import scheduler

    monkeypatch.setattr(scheduler, "send_on_commit", lambda *args, **kwargs: None)
    gpu_node("contended", [(24, 0, 0)])  # each server needs 5.8 GiB: at most 4 fit (23.2 GiB)
    racers = 10
    barrier = threading.Barrier(racers)
    outcomes: list[str] = []

    def race(i: int) -> None:
        try:
            barrier.wait()
            place(gpu_request(f"racer-{i}"))
            outcomes.append("placed")
        except PlacementRefused as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("placed") == 4
    assert outcomes.count("CAPACITY_CONSTRAINED") == racers - 4
    reserved = sum(Reservation.objects.values_list("bytes", flat=True))
    assert reserved <= 24 * GIB


def test_the_api_places_and_refuses_with_the_envelope(operator_client):
    gpu_node("rig", [(24, 20, 0)])
    body = {"name": "api-srv", "profile": "test-echo-gpu", "model": "m1", "gpus": 1, "weights_bytes": 4 * GIB}
    refusal = operator_client.post("/api/v1/servers", body, format="json")
    assert refusal.status_code == 409
    assert set(refusal.json()) == {"code", "message", "correlation_id"}
    assert refusal.json()["code"] == "CAPACITY_CONSTRAINED"
    assert "[rig]" in refusal.json()["message"]
    body["weights_bytes"] = 2 * GIB  # 3.4 GiB fits in 4
    created = operator_client.post("/api/v1/servers", body, format="json")
    assert created.status_code == 201, created.content
    detail = created.json()
    assert detail["state"] == "starting" and detail["node_name"] == "rig" and detail["gpu_indexes"] == [0]
    assert [e["to_state"] for e in detail["events"]] == ["starting", "placing"]
    listed = operator_client.get("/api/v1/servers?state=starting&node=rig").json()
    assert [s["name"] for s in listed["results"]] == ["api-srv"]
    duplicate = operator_client.post("/api/v1/servers", body, format="json")
    assert duplicate.status_code == 409 and duplicate.json()["code"] == "NAME_TAKEN"
    assert "name" in duplicate.json()["message"]


def test_a_server_of_an_artifact_takes_its_name_size_and_encryption(settings):
    from apps.artifacts.models import Artifact

    gguf = Artifact.objects.create(
        name="gemma",
        source_kind="local",
        locator="/m",
        state="ready",
        format="gguf_file",
        size_bytes=GIB,
        files=[{"path": "gemma.gguf", "size": GIB, "sha256": "0" * 64}],
    )
    from apps.artifacts.models import Replica

    local = cpu_node("local-cpu")
    Replica.objects.create(artifact=gguf, node=local, state="present", name="gemma.gguf")
    settings.LOCAL_NODE = "local-cpu"
    server = place(Request(name="g", profile="llamacpp-gguf", model="", artifact=gguf))
    assert (server.model, server.weights_bytes, server.artifact) == ("gemma.gguf", GIB, gguf)

    sealed = Artifact.objects.create(
        name="sealed",
        source_kind="local",
        locator="/s",
        state="ready",
        encrypted=True,
        size_bytes=GIB,
        files=[],
    )
    gpu_node("remote", [(80, 0, 0)])
    settings.LOCAL_NODE = ""
    with pytest.raises(ApiError) as caught:
        place(Request(name="s", profile="test-echo-gpu", model="", gpus=1, artifact=sealed))
    assert caught.value.code == "encrypted_weights_local_only"

    quarantined = Artifact.objects.create(name="q", source_kind="local", locator="/q", state="quarantined")
    with pytest.raises(ApiError) as caught:
        place(Request(name="q", profile="test-echo", model="", artifact=quarantined))
    assert (caught.value.code, caught.value.status) == ("ARTIFACT_NOT_READY", 409)


def test_a_server_of_an_artifact_goes_only_where_a_replica_is_recorded_present():
    from apps.artifacts.models import Artifact, Replica

    weights = Artifact.objects.create(
        name="w", source_kind="local", locator="/w", state="ready", format="safetensors_dir", size_bytes=GIB
    )
    gpu_node("roomy", [(80, 0, 0)])
    holder = gpu_node("holder", [(24, 0, 0)])
    copying = gpu_node("copying", [(24, 0, 0)])
    Replica.objects.create(artifact=weights, node=copying, state="copying", name="w")
    # No replica present anywhere (one still copying): refused by the key, before anything is reserved.
    refusal = refused(Request(name="a", profile="test-echo-gpu", model="", gpus=1, artifact=weights))
    assert (refusal.code, refusal.status) == ("model_not_present_on_node", 409)
    assert "[copying] model_not_present_on_node" in refusal.message
    Replica.objects.create(artifact=weights, node=holder, state="present", name="w")
    assert placed_on(
        place(Request(name="b", profile="test-echo-gpu", model="", gpus=1, artifact=weights))
    ) == ("holder")


# Seeds, "A remote start is refused outright": model_not_present_on_node at placement, not a second later.
def test_a_pinned_node_without_the_model_is_refused_by_its_key_before_anything_is_recorded():
    gpu_node("bare", [(80, 0, 0)], models=[])
    refusal = refused(gpu_request("pinned", model="m1", node="bare"))
    assert (refusal.code, refusal.status) == ("model_not_present_on_node", 409)
    assert "Replicate the model to that node first." in refusal.message
    assert "[bare] model_not_present_on_node" in refusal.message
    assert not ModelServer.objects.exists() and not Reservation.objects.exists()


def test_nodes_without_the_model_do_not_fit_and_say_why(settings):
    settings.PLACEMENT_STRATEGY = "spread"
    gpu_node("bare", [(80, 0, 0)], models=["other"])
    gpu_node("holder", [(24, 0, 0)], models=["m1"])
    # bare has more room (spread would choose it): the model decides first.
    assert placed_on(place(gpu_request("srv", model="m1"))) == "holder"
    gpu_node("full", [(24, 23, 0)], models=["m1"])
    refusal = refused(gpu_request("big", model="m1", weights_gib=30))
    assert refusal.code == "CAPACITY_CONSTRAINED"
    assert "[bare] model_not_present_on_node: 'm1' is not on this node" in refusal.message


def test_no_node_holding_the_model_is_refused_by_the_key_with_every_node_named():
    gpu_node("bare-1", [(80, 0, 0)], models=[])
    cpu_node("cpu-elsewhere", models=[])  # not a candidate for a GPU profile: named as not eligible
    gpu_node("bare-2", [(80, 0, 0)], models=["m2"])
    refusal = refused(gpu_request("srv", model="m1"))
    assert (refusal.code, refusal.status) == ("model_not_present_on_node", 409)
    assert "[bare-1] model_not_present_on_node" in refusal.message
    assert "[bare-2] model_not_present_on_node" in refusal.message
    # A node holding the model but full is the scheduler's capacity answer, not a presence problem.
    gpu_node("full", [(24, 23, 0)], models=["m1"])
    assert refused(gpu_request("srv2", model="m1")).code == "CAPACITY_CONSTRAINED"


def test_the_api_refuses_a_pinned_start_on_a_node_without_the_model(operator_client):
    gpu_node("rig", [(24, 0, 0)], models=[])
    body = {"name": "api-srv", "profile": "test-echo-gpu", "model": "m1", "gpus": 1, "weights_bytes": GIB}
    refusal = operator_client.post("/api/v1/servers", {**body, "node": "rig"}, format="json")
    assert refusal.status_code == 409
    assert refusal.json()["code"] == "model_not_present_on_node"
    assert "Replicate the model to that node first." in refusal.json()["message"]


@pytest.mark.parametrize("strategy", ["spread", "pack"])
def test_a_node_whose_reservations_fill_it_is_not_ranked_on_its_report(settings, strategy):
    # The one-GPU ranking aggregates reported headroom and replaces a reserved node's numbers with its
    # exact ones: a node that looks best on its report but whose reservations fill it must not be ranked.
    settings.PLACEMENT_STRATEGY = strategy
    gpu_node("a-filled", [(24, 0, 0), (24, 10, 0)])
    gpu_node("b-other", [(24, 6, 0)])
    # Fill a-filled: 17.8 GiB each on both GPUs (its report still says 24 and 14 GiB free).
    place(gpu_request("fill-0", weights_gib=14, node="a-filled"))
    place(gpu_request("fill-1", weights_gib=7.5, node="a-filled"))  # 10 GiB: GPU 1 (14 free) or GPU 0 (6.2)
    # Left: a-filled 6.2 and 4.0 GiB, b-other 18 GiB; 11.8 GiB fits only b-other.
    assert placed_on(place(gpu_request("next", weights_gib=9))) == "b-other"
    assert refused(gpu_request("last", weights_gib=9)).code == "CAPACITY_CONSTRAINED"


@pytest.mark.parametrize("strategy", ["spread", "pack"])
def test_the_one_gpu_ranking_returns_the_rows_of_the_general_ranking(settings, strategy):
    # _RANK_ONE_GPU is a faster shape of _ranking(gpus=True, single=True): same rows, same order, over a
    # fleet with reservations, an ineligible node, a node without the model and GPUs too small.
    from apps.servers import scheduler

    settings.PLACEMENT_STRATEGY = strategy
    for i in range(16):
        gpu_node(f"n-{i:02d}", [(24, (i * 5) % 20, 0), (48, (i * 7) % 40, 0), (16, 15, 0)])
    gpu_node("off", [(80, 0, 0)], enabled=False)
    gpu_node("elsewhere", [(80, 0, 0)], models=["other"])
    for i in range(12):
        place(gpu_request(f"r-{i}", weights_gib=2 + i))
    profile = scheduler._profile("test-echo-gpu")
    general = scheduler._ranking(gpus=True, single=True)
    for weights_gib in (1, 4, 10, 20, 30, 60):
        need, _ = profile.memory_need(int(weights_gib * GIB), 1)
        params = scheduler._ranking_params(profile, 1, need, timezone.now(), None, "m1", None)
        with connection.cursor() as cursor:
            cursor.execute(general, params)
            expected = cursor.fetchall()
            cursor.execute(scheduler._RANK_ONE_GPU[strategy == "spread"], params)
            assert cursor.fetchall() == expected, weights_gib
        assert expected or weights_gib > 10  # the small needs do fit somewhere
