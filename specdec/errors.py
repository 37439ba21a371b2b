"""User-facing errors.

Every problem a user can cause (bad flag, missing file, unknown model, prompt too long, mismatched
draft/target pair) is raised as a :class:`SpecdecError` with a message that says what is wrong and
what to do. The CLI prints the message on one line and exits non-zero; the server turns it into an
OpenAI-style error object. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SpecdecError(Exception):
    """An error caused by the user's input, with a message meant to be read by them."""


class ModelNotFoundError(SpecdecError):
    """Unknown built-in model name, or a path that does not exist."""


class WeightsError(SpecdecError):
    """A weights file that is missing, truncated, corrupt or of an unsupported layout."""


class ContextLengthError(SpecdecError):
    """The prompt plus requested tokens do not fit the model's context window."""


class StructuredOutputError(SpecdecError):
    """An output constraint that cannot be enforced as given (a schema, regex, grammar or choice list): the server's
    400 names the request field that carried it (``response_format``, ``structured_outputs``, ``tools``)."""


class TemplateArgumentError(SpecdecError):
    """A chat template variable the caller may not set (``chat_template_kwargs`` naming one of the request's own
    fields): the server names that field in its 400, not ``messages``."""


class DrafterError(SpecdecError):
    """A drafter broke its contract or failed — a method's code (often a plugin's), not the request: the server
    answers it with a 500, not a 400 blaming the client."""


class UnreadOptionWarning(UserWarning):
    """A ``draft=`` or SpecConfig option the chosen method does not read (:func:`specdec.api.warn_unread`; the
    CLI, which says so in its own words before loading, filters these out). Here, not in api.py, so the CLI
    names the category without importing torch."""


class IncompatibleModelsError(SpecdecError):
    """Draft and target cannot be paired without breaking exactness (vocabulary, special ids …)."""
