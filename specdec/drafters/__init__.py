"""Drafting methods; importing this package registers every built-in one."""

from specdec.drafters import draft_model, draft_suffix, layer_skip, prompt_lookup, retrieval, suffix  # noqa: F401
from specdec.drafters.base import DRAFTERS, Draft, Drafter, get_drafter_factory, register_drafter

__all__ = ["DRAFTERS", "Draft", "Drafter", "get_drafter_factory", "register_drafter"]
