"""Fixtures of the drafter kinds' tests: the LM task's tiny Llama checkpoint."""

from tests.tasks.lm.conftest import checkpoint  # noqa: F401 (a fixture)
