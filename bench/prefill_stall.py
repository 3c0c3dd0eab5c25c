"""How long running streams wait while a long prompt is read beside them (chunked prefill).

In this process, with trexo's own batch engine on the demo model: 4 streams decode, then a
3,000-token prompt joins. Each step then decodes one token of every stream and reads one
`prefill_step` chunk of the prompt, so a stream's next token waits for that step.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

RUNNING_STREAMS = 4
WARM_STEPS = 20
DECODE_STEPS = 30
LONG_PROMPT_CHARS = 12000
"""~3,000 tokens of the demo tokenizer."""


def measure(model_dir: Path) -> dict[str, Any]:
    from pydoc_data.topics import topics

    from trexo.engine.engine import Engine
    from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
    from trexo.types.ids import RequestId

    engine = Engine.load(model_dir)
    engine.warmup()
    batch = engine.batch()
    for k in range(RUNNING_STREAMS):
        request = GenerationRequest(
            RequestId(f"stream-{k}"),
            messages=(ChatMessage("user", f"{k}: tell me about the with statement"),),
            params=SamplingParams(max_tokens=4000),
        )
        batch.add(request, engine.admit(request))
    for _ in range(WARM_STEPS):
        batch.step()
    decode = []
    for _ in range(DECODE_STEPS):
        started = time.perf_counter()
        batch.step()
        decode.append(time.perf_counter() - started)
    long = GenerationRequest(
        RequestId("long"),
        messages=(ChatMessage("user", topics["compound"][:LONG_PROMPT_CHARS]),),
        params=SamplingParams(max_tokens=4),
    )
    prompt = engine.admit(long)
    batch.add(long, prompt)
    reading = []
    while True:
        started = time.perf_counter()
        chunks = batch.step()
        reading.append(time.perf_counter() - started)
        if any(c.request_id == long.request_id for c in chunks):
            break
    return {
        "running_streams": RUNNING_STREAMS,
        "prompt_tokens": len(prompt),
        "prefill_step": engine.prefill_step,
        "decode_step_median_ms": statistics.median(decode) * 1e3,
        "step_with_prefill_median_ms": statistics.median(reading) * 1e3,
        "step_with_prefill_max_ms": max(reading) * 1e3,
        "steps_reading_the_prompt": len(reading),
    }
