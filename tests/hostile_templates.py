"""Chat templates that fail as stock ones do on ordinary input, or never end."""

RAISES_ON_SYSTEM = (
    "{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
"""Raises on a system turn, as Gemma's does."""
LOOPS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
"""Ten billion empty iterations: a template that never ends in practice."""
