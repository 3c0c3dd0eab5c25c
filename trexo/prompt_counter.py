"""Counts a request's prompt tokens on the API's node, with its model's own tokenizer.

Node-lifetime, like the API: tokenizers are loaded once per model (in a worker thread; a
tokenizer is a few MB, its model may be hundreds of GB elsewhere) and kept in a small LRU.
A model whose files are not on this node cannot be counted here: the runner then checks the
same limit itself (`trexo.engine.engine.check_fits`).

Counting renders the model's chat template, which is code from the model's files: it runs
in threads of its own (`trexo.thread_pools`), within a time budget, and what it raises on a
request's messages is that request's 400 (`GenerationRejected`), as the runner would answer.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

import attrs
import trio

from trexo import catalog, thread_pools
from trexo.api.admission import PromptBudget
from trexo.config import TEMPLATE_RENDER_TIMEOUT_S, TOKENIZER_CACHE_SIZE
from trexo.engine.prompt import PromptError, encode_prompt
from trexo.errors import GenerationRejected, ModelNotFound
from trexo.hub.cache import RepoCache
from trexo.hub.files import CONFIG_FILE, TOKENIZER_CONFIG
from trexo.types.generation import GenerationRequest
from trexo.types.models import ModelRef

log = logging.getLogger(__name__)


@attrs.frozen
class _Tokenizer:
    tokenizer: Any
    context: int | None


def _load(model: ModelRef, models_dir: Path, hub_cache: Path) -> _Tokenizer | None:
    from mlx_lm.utils import load_tokenizer  # heavy (transformers): only when first needed

    from trexo.engine.prompt import read_context_length

    model_dir = _local_dir(model, models_dir, hub_cache)
    if model_dir is None:
        return None
    tokenizer = load_tokenizer(model_dir)  # type: ignore[no-untyped-call]
    return _Tokenizer(tokenizer, read_context_length(model_dir))


def _local_dir(model: ModelRef, models_dir: Path, hub_cache: Path) -> Path | None:
    """Where this node has the model's tokenizer and config, if it has them."""
    revision = model.hub_revision
    if revision is not None:
        if not revision.is_pinned:  # a branch name, not placed: no snapshot is named so
            return None
        # A download puts the tokenizer's config into the snapshot after every other file.
        snapshot = RepoCache(hub_cache, revision.repo_id).snapshot(revision.commit)
        ready = all((snapshot / name).is_file() for name in (CONFIG_FILE, TOKENIZER_CONFIG))
        return snapshot if ready else None
    try:
        return catalog.model_dir(model, models_dir)
    except ModelNotFound:
        return None


def _import_tokenizers() -> None:
    import mlx_lm.utils  # noqa: F401

    import trexo.engine.prompt  # noqa: F401


def _key(model: ModelRef) -> str:
    return f"{model.model_id}\0{model.source}"


def _count(tokenizer: Any, request: GenerationRequest, render_timeout: float) -> int:
    return len(encode_prompt(tokenizer, request, render_timeout=render_timeout))


class PromptCounter:
    def __init__(
        self,
        models_dir: Path,
        hub_cache: Path,
        *,
        cache_size: int = TOKENIZER_CACHE_SIZE,
        render_timeout: float = TEMPLATE_RENDER_TIMEOUT_S,
    ) -> None:
        self._render_timeout = render_timeout
        self._models_dir = models_dir
        self._hub_cache = hub_cache
        self._cache_size = cache_size
        self._cache: OrderedDict[str, _Tokenizer] = OrderedDict()
        self._lock = trio.Lock()  # one load at a time: a second caller waits for the first

    async def warm_up(self) -> None:
        """Import the tokenizer machinery now, in a worker thread: it takes ~1 s (mlx-lm and
        transformers), which a node's first chat would otherwise wait for."""
        try:
            await thread_pools.run_sync("prompts", _import_tokenizers)
        except Exception as exc:  # e.g. out of file descriptors: the first chat tries again
            log.warning("could not import the tokenizer machinery ahead of use: %s", exc)

    async def budget(self, model: ModelRef, request: GenerationRequest) -> PromptBudget | None:
        """The request's prompt size and its model's context; None if not countable here.
        `GenerationRejected` if the model's chat template refuses the request."""
        loaded = await self._tokenizer(model)
        if loaded is None:
            return None
        try:
            count = await thread_pools.run_sync(
                "prompts", _count, loaded.tokenizer, request, self._render_timeout
            )
        except PromptError as exc:
            raise GenerationRejected(str(exc)) from None
        except Exception as exc:
            # The runner, which holds the model, is the authority: it refuses what cannot
            # be encoded with a 400. Forget this tokenizer in case it was loaded wrong.
            log.warning("could not count the prompt for %s here (%s)", model.model_id, exc)
            self._cache.pop(_key(model), None)
            return None
        return PromptBudget(count, loaded.context)

    async def _tokenizer(self, model: ModelRef) -> _Tokenizer | None:
        key = _key(model)
        async with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            try:
                loaded = await thread_pools.run_sync(
                    "prompts", _load, model, self._models_dir, self._hub_cache
                )
            except Exception:
                # Not this request's fault; the runner checks the limit too.
                log.exception("could not load the tokenizer of %s", model.model_id)
                return None
            if loaded is None:
                log.debug("%s has no files on this node; its runner checks sizes", model.model_id)
                return None
            self._cache[key] = loaded
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return loaded
