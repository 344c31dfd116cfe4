"""The context a managed model's server serves one request (SPEC §17.2), and the warning
when it serves less than the model's configured ``context``.

Its server's answers are the registry's (``/props``, asked with the health check that
follows a load: :attr:`~proxy.registry.backends.LocalBackend.served`); until then, the
configuration's. :meth:`ServedContexts.check` follows the registry's changes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol.served_context import capped_message, entry_context

if TYPE_CHECKING:
    from proxy.models.lifecycle import Lifecycle
    from proxy.models.managed import Managed
    from proxy.notifications import Notifications
    from proxy.registry.backends import BackendRegistry, LocalBackend

CONTEXT_CAPPED = "context_capped"  # the notification's code


class ServedContexts:
    """The served contexts of one gateway's managed models (``backends``: each model's
    registry backend, by name, as :class:`~proxy.models.ondemand.OnDemand` keeps them)."""

    def __init__(self, lifecycle: Lifecycle, backends: dict[str, LocalBackend],
                 notifications: Notifications | None) -> None:
        self.lifecycle = lifecycle
        self.backends = backends
        self.notifications = notifications
        # name -> (configured context, what its server served), where it served less
        self.capped: dict[str, tuple[int, int]] = {}
        self._said: str | None = None

    def __repr__(self) -> str:
        return f"ServedContexts(capped={self.capped})"

    def planned(self, name: str) -> int | None:
        """A managed model's context for one request until its server says: the bundled
        llama.cpp divides ``context`` among its ``parallel`` slots; a command's server
        sizes its own (None: unknown until it answers)."""
        model = self.lifecycle.models.get(name)
        if model is None or not model.spec.engine.loads_file:
            return None
        return max(1, model.spec.context // model.spec.parallel)

    def of(self, model: Managed) -> int | None:
        """The context one request can use: its server's once loaded (``/props``, else its
        own model list), else :meth:`planned`."""
        backend = self.backends.get(model.name)
        if backend is not None and backend.live:
            if backend.served is not None:
                return backend.served.per_slot
            listed = entry_context(backend.models[0]) if backend.models else None
            if listed is not None:
                return listed
        return self.planned(model.name)

    def check(self, _registry: BackendRegistry | None = None) -> None:
        """After each change of the registry: a bundled model whose server serves less
        context (all its slots together) than its configured ``context`` is named in one
        warning with both numbers, kept until its configuration changes or it leaves."""
        notes = self.notifications
        if notes is None:
            return
        models = self.lifecycle.models
        capped = self.capped
        for name in list(capped):
            model = models.get(name)
            if model is None or model.spec.context != capped[name][0]:
                del capped[name]
        for name, backend in self.backends.items():
            model = models.get(name)
            served = backend.served
            if model is None or served is None or not backend.live \
                    or not model.spec.engine.loads_file:
                continue
            if model.spec.context > served.whole:
                capped[name] = (model.spec.context, served.whole)
            else:
                capped.pop(name, None)
        said = capped_message((n, c, s) for n, (c, s) in sorted(capped.items())) \
            if capped else None
        if said == self._said:
            return
        self._said = said
        if said is None:
            notes.clear(CONTEXT_CAPPED)
        else:
            notes.raise_(CONTEXT_CAPPED, said)
