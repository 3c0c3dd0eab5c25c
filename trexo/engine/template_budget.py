"""A time budget for rendering a chat template: a template that loops ends as an error.

A chat template is code that came with the model's files, run on every request. Jinja's
sandbox (which transformers renders in) keeps it from reaching outside, and caps each
`range`, but nested loops still run for hours, and a thread cannot be killed. Jinja compiles
a template to Python functions whose code is named `<template>`; while the budget runs, a
trace function on this thread watches only those frames (every other frame runs untraced)
and raises `TemplateTimeout` inside the template once it has used its budget. The render
then fails like any template error, and its thread is free again.

The budget is the thread's own CPU time, not the wall clock: on a busy machine (other
processes, the GIL held by a runner's compute thread) an ordinary template takes longer by
the clock but not in CPU, so load never turns a good template into an error.

What it cannot stop is one long call into C (a huge string repeat): that is bounded by
memory, not time, and a template doing it fails on the first request that renders it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

TEMPLATE_CODE = "<template>"
"""The file name Jinja gives the code of a template compiled from a string."""


class TemplateTimeout(Exception):
    """The template ran past its budget."""


@contextmanager
def template_budget(seconds: float) -> Iterator[None]:
    """Within the block, a Jinja template rendered on this thread raises `TemplateTimeout`
    once this thread has spent `seconds` of CPU time. Other tracing (a debugger, coverage)
    goes on meanwhile."""
    deadline = time.thread_time() + seconds
    previous: Any = sys.gettrace()  # a debugger's or coverage's, if any

    def in_template(frame: FrameType, event: str, arg: Any) -> Any:
        if time.thread_time() > deadline:
            raise TemplateTimeout(f"the chat template took more than {seconds:g} s of CPU time")
        return in_template

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == TEMPLATE_CODE:
            return in_template(frame, event, arg)
        return previous(frame, event, arg) if previous is not None else None

    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)
