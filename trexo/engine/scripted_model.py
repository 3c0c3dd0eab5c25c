"""The scripted demo model (size "tools"): greedy output follows a fixed tool-calling script.

Tests of tool calling need a model that calls a tool when tools are offered and answers once
the result is back. Random weights cannot, so this model's weights are constructed: a one-layer
llama whose greedy next token is a lookup on (last token, which marker the context holds):

- a plain chat is answered with `SCRIPTED_PLAIN_ANSWER`;
- with tools offered (`<tools>` in the prompt) it answers `SCRIPTED_TOOL_CALL_TEXT`;
- with a tool result present (`<tool_response>`) it answers `SCRIPTED_TOOL_RESULT_ANSWER`;
- a prompt that ends with `<tool_call>` (a forced call) is continued into the same call.

Each answer ends with `<|im_end|>`; any other last token is answered with `<|im_end|>` at once.
The tokenizer is the other demo models' BPE plus added tokens: the tool-calling markers, and
the script's pieces, so every scripted token is distinct (a bigram lookup needs that) and each
answer streams in a few deltas. The chat template is Qwen2.5's style, so mlx-lm picks its
`json_tools` parser for this model.

How the weights compute the lookup (residual dims: a constant "bias" dim, a one-hot dim per
scripted token, and two "marker seen" dims):

- attention: a constant query scores only the marker tokens' keys (`<tool_response>` above
  `<tools>`, so a result outranks the offer), in the lowest-frequency RoPE pair, which
  position barely rotates; each marker's value writes its "seen" dim;
- MLP: each unit's SiLU gate opens only on one scripted token (or always, for the default
  `<|im_end|>`), and its up projection reads the bias or a "seen" dim: products, so "newline
  and tools seen" is one unit;
- the head is the embedding (tied): the MLP writes the next token's one-hot dim, far larger
  than the rest of the residual stream.

The construction takes any `Script` (its tokens, template and lookup): the thinking model's
(`trexo.engine.thinking_model`) is another, and a family's real chat template with its own
markers can be scripted the same way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from trexo.engine.demo_model import (
    DEMO_VOCAB_SIZE,
    IM_END,
    TOOLS_DEMO_SIZE,
    DemoModelSpec,
    _corpus_digest,
    _model_config,
    _token_id,
    _train_tokenizer,
    _training_corpus,
    _write_json,
    _write_tokenizer,
)
from trexo.types.generation import ToolSpec

if TYPE_CHECKING:
    import mlx.core as mx

# --- the script ----------------------------------------------------------------------------

SCRIPTED_TOOL_NAME: Final = "get_weather"
SCRIPTED_TOOL_ARGUMENTS: Final[Mapping[str, str]] = {"city": "Paris"}
SCRIPTED_TOOL: Final = ToolSpec(
    SCRIPTED_TOOL_NAME,
    "The weather in a city",
    json.dumps(
        {"type": "object", "properties": {"city": {"type": "string", "description": "A city"}}}
    ),
)
"""The function the script calls, as a request offers it (every part described: Command R's
template renders each parameter's description)."""
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOLS_START = "<tools>"
TOOLS_END = "</tools>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
NEWLINE = "\n"
"""The generation prompt's last token (`<|im_start|>assistant\\n`): where answers start."""

_TOOL_CALL_BODY_PIECES: Final = (
    f'\n{{"name": {json.dumps(SCRIPTED_TOOL_NAME)}, "arguments": ',
    json.dumps(SCRIPTED_TOOL_ARGUMENTS) + "}\n",
)
"""The JSON between the call's markers, as Qwen2.5's template renders it (newline-wrapped)."""
_PLAIN_PIECES: Final = ("I have", " no tools", " for that.")
_RESULT_PIECES: Final = ("It is", " sunny", " in Paris.")

SCRIPTED_TOOL_CALL_TEXT: Final = TOOL_CALL_START + "".join(_TOOL_CALL_BODY_PIECES) + TOOL_CALL_END
"""The whole answer when tools are offered (before `<|im_end|>`)."""
SCRIPTED_PLAIN_ANSWER: Final = "".join(_PLAIN_PIECES)
SCRIPTED_TOOL_RESULT_ANSWER: Final = "".join(_RESULT_PIECES)

ADDED_TOKENS: Final = (
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOLS_START,
    TOOLS_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
    *_TOOL_CALL_BODY_PIECES,
    *_PLAIN_PIECES,
    *_RESULT_PIECES,
)

TOOLS_CHAT_TEMPLATE: Final = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML in Qwen2.5's style: tools listed as JSON in the system turn, calls as
`<tool_call>` JSON, tool results in a user turn (consecutive results share one)."""

ROPE_THETA: Final = 1_000_000.0
"""Qwen2.5's: the lowest-frequency pair turns < 0.01 rad over 4096 positions (head_dim 32)."""


def _chain(pieces: Sequence[str]) -> dict[str, str]:
    """Each piece's successor; the last one's is `<|im_end|>`."""
    return dict(zip(pieces, (*pieces[1:], IM_END), strict=True))


BIGRAMS: Final[Mapping[str, str]] = {
    NEWLINE: _PLAIN_PIECES[0],  # no marker seen: a plain chat
    **_chain((TOOL_CALL_START, *_TOOL_CALL_BODY_PIECES, TOOL_CALL_END)),
    **_chain(_PLAIN_PIECES),
    **_chain(_RESULT_PIECES),
}
"""The next token after each scripted token (after a newline: when no marker was seen)."""
MARKERS: Final[Mapping[str, str]] = {
    TOOLS_START: TOOL_CALL_START,
    TOOL_RESPONSE_START: _RESULT_PIECES[0],
}
"""What follows a newline once the marker was seen (with both, `MARKER_SCORES` decides)."""

# --- the construction ----------------------------------------------------------------------

BIAS_DIM = 0
"""Every token's embedding is 1 here: the constant that the query and the gates read."""
MARKER_SCORES: Final[Mapping[str, float]] = {TOOLS_START: 20.0, TOOL_RESPONSE_START: 40.0}
"""Attention logits of the markers (every other token scores 0): 4096 other tokens keep
< 1e-5 of the weight from a marker, and a tool result outweighs a tools list as much."""
GATE_GAIN = 10.0
"""A gate's pre-activation per normalised unit (~3.3 to 5.7 here): closed gates sit below
-30, where SiLU is ~1e-12."""
MARKER_VOTE = 2.0
"""A seen marker's vote, at a newline, for its answer and against the plain answer."""
DEFAULT_VOTE = 0.1
"""The always-open unit's vote for `<|im_end|>`: every scripted successor outvotes it."""
FINAL_NORM_SCALE = 10.0
"""Scales the logits: the scripted token leads the next by ~50 nats."""


@attrs.frozen
class Script:
    """What a scripted model says, and the files that make it say it: its size's name, the
    tokens added to the BPE (one per scripted piece), its chat template, and the lookup."""

    size: str
    added_tokens: tuple[str, ...]
    chat_template: str
    bigrams: Mapping[str, str]
    """The next token after each scripted token (after the `cue`: when no marker was seen)."""
    markers: Mapping[str, str] = attrs.field(factory=dict)
    """What follows the `cue` once the marker was seen (with several, `marker_scores`
    decides)."""
    marker_scores: Mapping[str, float] = attrs.field(factory=dict)
    """Attention logits of the markers (every other token scores 0)."""
    cue: str = NEWLINE
    """The generation prompt's last token, where answers start (one token: `NEWLINE`, or
    an added one for templates whose generation prompt ends otherwise)."""
    end_tokens: tuple[str, ...] = ()
    """Added tokens that also end a generation, listed in `generation_config.json` (as
    gpt-oss lists `<|call|>`)."""


TOOLS_SCRIPT: Final = Script(
    TOOLS_DEMO_SIZE, ADDED_TOKENS, TOOLS_CHAT_TEMPLATE, BIGRAMS, MARKERS, MARKER_SCORES
)


def build_scripted_model(
    dest: Path, spec: DemoModelSpec, seed: int, script: Script = TOOLS_SCRIPT
) -> Path:
    """Build the model of `script` into `dest`; the seed is recorded but changes nothing."""
    if DEMO_VOCAB_SIZE + len(script.added_tokens) != spec.vocab_size:
        raise RuntimeError(f"the spec expects {spec.vocab_size - DEMO_VOCAB_SIZE} added tokens")
    corpus = _training_corpus()
    tokenizer = _train_tokenizer(corpus, DEMO_VOCAB_SIZE, script.added_tokens)
    if tokenizer.get_vocab_size() != spec.vocab_size:
        raise RuntimeError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens, not the spec's")
    ids = _write_tokenizer(dest, tokenizer, script.chat_template)
    token_ids = {token: _token_id(tokenizer, token) for token in (IM_END, *script.added_tokens)}
    cue = tokenizer.encode(script.cue).ids
    if len(cue) != 1:
        raise RuntimeError(f"the cue {script.cue!r} is not one token")
    token_ids[script.cue] = cue[0]
    config = _model_config(spec, script.size, seed, ids[IM_END], _corpus_digest(corpus))
    config["rope_theta"] = ROPE_THETA
    _save_weights(dest, config, _weights(spec, token_ids, script))
    if script.end_tokens:
        ends = [ids[IM_END], *(token_ids[token] for token in script.end_tokens)]
        _write_json(dest / "generation_config.json", {"eos_token_id": ends})
    return dest


def _weights(
    spec: DemoModelSpec, token_ids: Mapping[str, int], script: Script
) -> dict[str, mx.array]:
    """The constructed parameters, by their mlx-lm llama names."""
    import mlx.core as mx

    hidden, units, cue = spec.hidden_size, spec.intermediate_size, script.cue
    if spec.num_hidden_layers != 1 or spec.num_attention_heads != 1:
        raise ValueError("the construction is for one layer with one attention head")
    dim = {token: 1 + index for index, token in enumerate(token_ids)}
    seen = {marker: 1 + len(dim) + index for index, marker in enumerate(script.markers)}
    if 1 + len(dim) + len(seen) > hidden:
        raise ValueError(f"hidden size {hidden} is too small for the script")

    embedding = mx.zeros((spec.vocab_size, hidden))
    embedding[:, BIAS_DIM] = 1.0
    for token, token_dim in dim.items():
        embedding[token_ids[token], token_dim] = 1.0
    # RMS-normalised, a scripted token's embedding is sqrt(hidden / 2) in each of its 2 dims.
    normed = math.sqrt(hidden / 2)

    # The query and the keys use the pair RoPE turns slowest: dim hidden/2 - 1 (its partner,
    # the last dim, stays 0), so position barely changes a score.
    slow = hidden // 2 - 1
    q_proj, k_proj, v_proj, o_proj = (mx.zeros((hidden, hidden)) for _ in range(4))
    q_proj[slow, BIAS_DIM] = 1.0
    for marker, score in script.marker_scores.items():
        # q . k / sqrt(head_dim) == score, for a scripted token's query
        k_proj[slow, dim[marker]] = score * math.sqrt(hidden) / normed**2
        v_proj[seen[marker], dim[marker]] = 1.0 / normed  # "seen" ~1, like the bias dim
        o_proj[seen[marker], seen[marker]] = 1.0

    gate, up = mx.zeros((units, hidden)), mx.zeros((units, hidden))
    down = mx.zeros((hidden, units))
    votes_by_unit: list[tuple[str | None, int, Mapping[str, float]]] = [
        *((token, BIAS_DIM, {successor: 1.0}) for token, successor in script.bigrams.items()),
        *(
            (cue, seen[marker], {answer: MARKER_VOTE, script.bigrams[cue]: -MARKER_VOTE})
            for marker, answer in script.markers.items()
        ),
        (None, BIAS_DIM, {IM_END: DEFAULT_VOTE}),
    ]
    if len(votes_by_unit) > units:
        raise ValueError(f"intermediate size {units} is too small for the script")
    # Unit u: SiLU(gate) opens on token `on` only (always, for None); up reads dim `reads`;
    # down writes the votes into the voted tokens' dims, which the tied head scores.
    for u, (on, reads, votes) in enumerate(votes_by_unit):
        if on is None:
            gate[u, BIAS_DIM] = GATE_GAIN
        else:  # +GATE_GAIN x norm where dim[on] equals the bias dim, -GATE_GAIN x norm where 0
            gate[u, dim[on]] = 2 * GATE_GAIN
            gate[u, BIAS_DIM] = -GATE_GAIN
        up[u, reads] = 1.0
        for token, vote in votes.items():
            down[dim[token], u] = vote

    ones = mx.ones((hidden,))
    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": embedding,
        layer + "input_layernorm.weight": ones,
        layer + "self_attn.q_proj.weight": q_proj,
        layer + "self_attn.k_proj.weight": k_proj,
        layer + "self_attn.v_proj.weight": v_proj,
        layer + "self_attn.o_proj.weight": o_proj,
        layer + "post_attention_layernorm.weight": ones,
        layer + "mlp.gate_proj.weight": gate,
        layer + "mlp.up_proj.weight": up,
        layer + "mlp.down_proj.weight": down,
        "model.norm.weight": ones * FINAL_NORM_SCALE,
    }


def _save_weights(dest: Path, config: dict[str, Any], weights: Mapping[str, mx.array]) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    model = llama.Model(llama.ModelArgs.from_dict(config))  # type: ignore[no-untyped-call]
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    shapes = {name: tuple(param.shape) for name, param in params}
    given = {name: tuple(weight.shape) for name, weight in weights.items()}
    if given != shapes:
        raise RuntimeError(f"the constructed weights do not fit the model: {given} != {shapes}")
    model.update(tree_unflatten(list(weights.items())))
    mx.eval(model.parameters())
    save_model(dest, model)
    save_config(config, dest / "config.json")
