"""Response formats whose every message opens with a header naming its section (gpt-oss's
harmony channels, Command R7B's sections), in the shape of mlx-lm's chat template modules'
`RESPONSE_FORMAT` (`mlx_lm.chat_templates.muse_spark`): the state machine starts in the
header, whose text is dropped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def sectioned(
    *, reasoning: tuple[str, str], answers: Sequence[str], answer_end: str, call: str
) -> dict[str, Any]:
    """The format: `reasoning`'s start and end markers, the markers that open an answer and
    the one that closes it, and the marker that opens a call (which its parser reads)."""
    return {
        "initial_state": "header",
        "transitions": {
            "header": [
                (reasoning[0], "reasoning"),
                *((marker, "normal") for marker in answers),
                (call, "tool"),
            ],
            "reasoning": [(reasoning[1], "header")],
            "normal": [(answer_end, "header")],
        },
    }
