"""Router.plan, the one routing decision (SPEC §7.1): local first, then a node, else 503.

In memory, no sockets: a backend registry and a node index filled through their owners'
methods, a settings stand-in. These are the "local" rows of the seed's fallback table (the
node rows are tests/test_resolve.py)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from protocol.config import BackendConfig, Config, NodeConfig
from protocol.errors import SluiceError
from protocol.headers import FORWARDED, Header
from protocol.request_info import RequestInfo, TimeoutClass
from proxy.registry.backends import BackendRegistry
from proxy.registry.nodes import ONLINE, NodeIndex
from proxy.routing.router import NodeUpstream, Router

NODES = (("a", 3), ("b", 2), ("c", 1))


class FakeSecrets:
    node_keys: dict[str, str] = {}


class FakeSettings:
    """What the router reads of proxy.settings.store.Settings."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.secrets = FakeSecrets()
        self.node_id = "us"


def router(*, lb: bool, local: bool, node_models: str = "m", **lb_fields: Any) -> Router:
    """Nodes a, b, c online holding ``node_models``; a local backend holding m (``local``);
    ``lb_fields``: other load_balancing settings."""
    nodes = tuple(NodeConfig(fp, fp, f"http://127.0.0.{i + 2}:9", p)
                  for i, (fp, p) in enumerate(NODES))
    config = attrs.evolve(Config(), nodes=nodes, load_balancing=attrs.evolve(
        Config().load_balancing, enabled=lb, **lb_fields))
    backends = BackendRegistry([BackendConfig("here", "http://127.0.0.1:9")], {})
    backends.ready.set()
    if local:
        backends.checked(backends.backends[0], [{"id": "m"}], None, 1.0)
    index = NodeIndex()
    index.sync(nodes)
    for endpoint in index.endpoints:
        index.checked(endpoint, ONLINE, [{"id": m} for m in node_models.split()], None, 1.0)
    index.round_done()
    return Router(FakeSettings(config), backends, index)  # type: ignore[arg-type]


def info(model: str = "m") -> RequestInfo:
    return RequestInfo(model, False, TimeoutClass.STANDARD)


def open_every_circuit(r: Router) -> None:
    now = trio.current_time()
    for view in r.views():
        for _ in range(view.breaker.failure_threshold):
            permit = view.breaker.allow(now, 30.0)
            assert permit is not None
            view.breaker.record_failure(permit, now)


FORWARDED_HEADERS: list[Header] = [(FORWARDED, b"other-gateway")]


@pytest.mark.parametrize(("lb", "headers", "node_models", "circuits_open"), [
    pytest.param(False, [], "m", False, id="lb_off_model_local"),
    pytest.param(True, [], "m", False, id="lb_on_model_local"),
    pytest.param(True, [], "m other", False, id="lb_on_duplicate_local_and_remote_id_local_wins"),
    pytest.param(True, [], "m", True, id="open_circuits_ignored_when_the_model_is_local"),
    pytest.param(True, FORWARDED_HEADERS, "m", False, id="forwarded_request_model_local"),
])
async def test_local_first(lb: bool, headers: list[Header], node_models: str,
                           circuits_open: bool) -> None:
    r = router(lb=lb, local=True, node_models=node_models)
    if circuits_open:
        open_every_circuit(r)
    plan = await r.plan(info(), headers)
    assert plan.upstream.served_by == b"local:here"
    assert plan.attempt.target is None
    assert not plan.may_fail_over
    assert (r.local.total, r.local.active) == (1, 1)  # counted locally, in flight


async def test_not_local_goes_to_the_top_node() -> None:
    r = router(lb=True, local=False)
    plan = await r.plan(info(), [])
    assert isinstance(plan.upstream, NodeUpstream)
    assert plan.upstream.served_by == b"node:a"
    assert plan.upstream.forwarded_by == b"us"
    assert plan.may_fail_over
    assert r.local.total == 0


@pytest.mark.parametrize(("lb", "headers", "code"), [
    pytest.param(False, [], "model_not_available", id="lb_off_not_local"),
    pytest.param(True, FORWARDED_HEADERS, "model_not_available", id="forwarded_not_local"),
])
async def test_no_route(lb: bool, headers: list[Header], code: str) -> None:
    r = router(lb=lb, local=False)
    with pytest.raises(SluiceError) as refused:
        await r.plan(info(), headers)
    assert (refused.value.status, refused.value.code) == (503, code)


async def test_every_circuit_open_and_not_local() -> None:
    r = router(lb=True, local=False)
    open_every_circuit(r)
    with pytest.raises(SluiceError) as refused:
        await r.plan(info(), [])
    assert (refused.value.status, refused.value.code) == (503, "all_circuits_open")


def test_one_definition_of_online() -> None:
    """Routing, the model list and the status answers all use NodeEndpoint.online."""
    r = router(lb=True, local=False)
    endpoint = r.nodes.endpoints[0]
    assert endpoint.online
    assert [v.online for v in r.views()] == [True, True, True]
    endpoint.address = None  # a URL that stopped parsing
    assert not endpoint.online
    assert [v.online for v in r.views()] == [False, True, True]
    assert endpoint not in r.nodes.online()
    kept: dict[str, Any] = r.nodes.holders()
    assert kept["m"] == ["b", "c"]


def test_owners_publish_their_changes() -> None:
    """The backend registry and the node index change their entries and say so."""
    r = router(lb=True, local=False)
    seen: list[Any] = []
    stop = r.backends.changes.subscribe(seen.append)
    backend = r.backends.backends[0]
    r.backends.checked(backend, [{"id": "m"}], None, 2.0)
    assert seen == [r.backends]
    assert r.backends.holder_of("m") is backend
    stop()
    r.backends.checked(backend, [], "down", None)
    assert len(seen) == 1  # unsubscribed
    assert r.backends.holder_of("m") is None

    changed: list[Any] = []
    r.nodes.changes.subscribe(changed.append)
    endpoint = r.nodes.endpoints[1]
    r.nodes.checked(endpoint, ONLINE, [{"id": "m"}], None, 1.0)  # nothing changed
    assert changed == []
    r.nodes.checked(endpoint, "offline", [], "refused", None)
    assert changed == [endpoint]
    assert not endpoint.online
    assert endpoint.model_ids == frozenset()


def cold(r: Router, *fingerprints: str) -> None:
    """These nodes list m as a sluice gateway lists a managed model it has not loaded."""
    for fp in fingerprints:
        endpoint = r.nodes.endpoint(fp)
        assert endpoint is not None
        r.nodes.checked(endpoint, ONLINE, [{"id": "m", "sluice": {"state": "unloaded"}}],
                        None, 1.0)


@pytest.mark.parametrize(("prefer_loaded", "first", "then"), [
    pytest.param(True, "b", "c", id="loaded_first"),
    pytest.param(False, "a", "b", id="plain_priority"),
])
async def test_a_node_that_has_the_model_loaded_goes_first(prefer_loaded: bool, first: str,
                                                           then: str) -> None:
    r = router(lb=True, local=False, prefer_loaded=prefer_loaded)
    cold(r, "a")  # a (top) lists m unloaded, b says nothing, c lists it loaded
    endpoint = r.nodes.endpoint("c")
    assert endpoint is not None
    r.nodes.checked(endpoint, ONLINE, [{"id": "m", "sluice": {"state": "loaded"}}], None, 1.0)
    assert [v.loaded for v in r.views()] == [frozenset(), {"m"}, {"m"}]
    plan = await r.plan(info(), [])
    assert plan.upstream.served_by == f"node:{first}".encode()
    # A failover stays loaded-first (b, c, then a) or plain (a, b, c).
    assert plan.alternate(trio.current_time())
    assert plan.upstream.served_by == f"node:{then}".encode()
