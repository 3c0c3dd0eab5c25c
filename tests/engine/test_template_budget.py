"""The chat template's time budget counts the rendering thread's CPU, not the clock."""

from __future__ import annotations

import time

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tests.hostile_templates import LOOPS
from trexo.engine.template_budget import TemplateTimeout, template_budget

ENVIRONMENT = ImmutableSandboxedEnvironment()


def test_a_template_that_loops_ends_past_its_cpu_budget() -> None:
    template = ENVIRONMENT.from_string(LOOPS)
    with template_budget(0.2), pytest.raises(TemplateTimeout, match=r"0\.2 s of CPU time"):
        template.render(messages=[])


def test_time_off_the_cpu_is_not_held_against_a_template() -> None:
    # A busy machine: the rendering thread waits (here: sleeps) longer than the budget by
    # the clock, but uses almost no CPU. It renders.
    template = ENVIRONMENT.from_string("{% for i in range(3) %}{{ wait() }}{% endfor %}done")
    started = time.monotonic()
    with template_budget(0.2):
        assert template.render(wait=lambda: time.sleep(0.15) or "") == "done"
    assert time.monotonic() - started > 0.2  # the clock did pass the budget
