"""The default model: `trexo run` without a model option places the demo model.

Once per session, and only if the cluster has no instance of it yet (the master decides
that atomically), so three nodes started the same way give one instance, not three.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from trexo.availability import failed_for_good, instance_availability
from trexo.cluster_client import ClusterClient, SessionTracker
from trexo.config import DEFAULT_MODEL_RETRY_S
from trexo.errors import ClusterError
from trexo.types.ids import InstanceId
from trexo.types.models import ModelRef
from trexo.types.runner_status import RunnerReady, RunnerRunning
from trexo.types.session import Session

log = logging.getLogger(__name__)

ReadyCallback = Callable[[ModelRef, InstanceId], None]
FailedCallback = Callable[[ModelRef, str], None]


class DefaultModel:
    def __init__(
        self,
        client: ClusterClient,
        sessions: SessionTracker,
        model: ModelRef,
        on_ready: ReadyCallback | None = None,
        on_failed: FailedCallback | None = None,
    ) -> None:
        self._client = client
        self._sessions = sessions
        self._model = model
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._announced = False

    async def run(self) -> None:
        placed_in: Session | None = None
        while True:
            session = await self._sessions.wait_session(float("inf"))
            if session != placed_in:
                # Placing before this node has reported its memory would be refused.
                state = self._client.current_state()
                if self._client.node_id not in state.nodes:
                    await self._sessions.wait_state_change(state)
                    continue
                try:
                    model = await self._client.pinned(self._model)
                    instance_id = await self._client.place_model(model, only_if_absent=True)
                except ClusterError as exc:
                    log.warning(
                        "could not place the default model %s: %s", self._model.model_id, exc
                    )
                    await trio.sleep(DEFAULT_MODEL_RETRY_S)
                    continue
                placed_in = session
                log.info("default model %s is instance %s", self._model.model_id, instance_id)
                if not self._announced:
                    await self._announce_when_ready(instance_id)
            await self._sessions.wait_change()

    async def _announce_when_ready(self, instance_id: InstanceId) -> None:
        """Tell the user once the model answers, or that it failed to load for good; give up
        quietly if the session ends first."""
        while self._sessions.session is not None:
            state = self._client.current_state()
            instance = state.instances.get(instance_id)
            if instance is None:
                return
            if failed_for_good(state, instance):
                self._announced = True
                if self._on_failed is not None:
                    self._on_failed(self._model, instance_availability(state, instance).reason)
                return
            record = state.runners.get(instance.lead.runner_id)
            if record is not None and isinstance(record.status, RunnerReady | RunnerRunning):
                self._announced = True
                if self._on_ready is not None:
                    self._on_ready(self._model, instance_id)
                return
            await self._sessions.wait_state_change(state)
