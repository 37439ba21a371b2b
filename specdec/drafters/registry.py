"""The method registry: every built-in drafter's :class:`MethodInfo`, looked up by name or alias.

The CLI, ``specdec bench``, the server and ``specdec verify`` all ask here which methods exist, what
users may call them, and whether one needs a draft model or specdec's torch backend — one copy of
each fact (the server once had its own list and refused ``draft_suffix`` requests). Built-ins are
listed explicitly below (no import side effects); :func:`register_method` adds a user's own in the running
process, and an installed package adds its methods to every process — each ``specdec`` command, a server's
Ray replicas — through the entry-point group ``specdec.methods`` (:data:`ENTRY_POINT_GROUP`), read the first
time a name is not found or the methods are listed (the CLI lists them in ``--method``'s help, so every command
reads them at start, ~50 ms), as vLLM reads its plugins.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from importlib.metadata import EntryPoint, entry_points

from specdec.config import SpecConfig
from specdec.drafters import draft_model, draft_suffix, eagle, layer_skip, medusa, prompt_lookup, retrieval, suffix
from specdec.drafters.base import Drafter, DrafterResources, MethodInfo
from specdec.errors import DrafterError, SpecdecError

#: names that mean "no drafter": plain autoregressive decoding
PLAIN_NAMES = ("ar", "plain", "none")

_METHODS: dict[str, MethodInfo] = {}
#: installed packages' methods: ``[project.entry-points."specdec.methods"] my_method = "my_pkg.drafters:METHOD"``,
#: the object a ``MethodInfo`` (or a function returning one)
ENTRY_POINT_GROUP = "specdec.methods"
_plugins_loaded = False
#: method name → the installed distribution (package) whose entry point registered it (``specdec methods`` says it)
_PLUGIN_SOURCES: dict[str, str] = {}
_PLUGINS_LOCK = threading.Lock()
#: entry-point key → why that installed plugin did not load (an unknown method of that name then says so)
_PLUGIN_FAILURES: dict[str, str] = {}


class PluginWarning(UserWarning):
    """An installed ``specdec.methods`` entry point that did not load: the other methods still work."""


def load_plugins() -> None:
    """Register every installed ``specdec.methods`` entry point, once per process. One that fails to import, is not
    a MethodInfo or clashes with a registered name is a warning naming it, not an error: a broken plugin must not
    take the built-in methods down with it."""
    global _plugins_loaded
    with _PLUGINS_LOCK:  # the server's event loop and model thread both look methods up
        if not _plugins_loaded:
            _register_plugins()
            _plugins_loaded = True


def _register_plugins() -> None:
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            info = point.load()
            info = info() if callable(info) and not isinstance(info, MethodInfo) else info
            if not isinstance(info, MethodInfo):
                raise TypeError(f"it is {type(info).__name__}, not a specdec.MethodInfo")
            existing = _METHODS.get(info.name)
            # the same method registered already: its module registers itself on import, or a second key names it
            same = existing is not None and (existing is info or existing.factory is info.factory)
            candidate = existing if same else info
            if _key(point.name) not in (_key(n) for n in (candidate.name, *candidate.aliases)):
                # the entry point's key is what its author will type: it names the method too (an alias)
                candidate = dataclasses.replace(candidate, aliases=(*candidate.aliases, point.name))
            clash = _name_clash(candidate, replace=same)
            if clash is not None:  # a name already taken: replace=True is not the plugin author's to pass
                _plugin_warning(point, f"{clash[0]}; rename the plugin's MethodInfo")
                continue
            if candidate is not existing:
                register_method(candidate, replace=same)
            _PLUGIN_SOURCES[info.name] = point.dist.name if point.dist is not None else point.value
        except Exception as exc:  # noqa: BLE001 - any failure of a third party's code
            _plugin_warning(point, f"{type(exc).__name__}: {exc}")


def _plugin_warning(point: EntryPoint, why: str) -> None:
    _PLUGIN_FAILURES[_key(point.name)] = f"the installed plugin {point.name!r} ({point.value}) did not load: {why}"
    warnings.warn(f"specdec method plugin {point.name!r} ({point.value}) not loaded: {why}", PluginWarning, stacklevel=3)


def build_drafter(info: MethodInfo, resources: DrafterResources) -> Drafter:
    """``info``'s drafter for one request, checked: a factory that raises, returns something other than a
    :class:`Drafter`, or a Drafter that does not override ``propose`` (or ``propose_steps``) is one
    :class:`DrafterError` naming the method — a plugin's mistake surfaced before decoding, not a traceback from
    deep in the engine (or, from a server, a 500 for every request with an empty message)."""
    try:
        drafter = info.factory(resources)
    except SpecdecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a third party's factory: say whose it is
        raise DrafterError(f"method {info.name!r}: its factory failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(drafter, Drafter):
        raise DrafterError(f"method {info.name!r}: its factory returned a {type(drafter).__name__}, not a specdec.Drafter")
    kind = type(drafter)
    if kind.propose is Drafter.propose and kind.propose_steps is Drafter.propose_steps:
        raise DrafterError(f"method {info.name!r}: {kind.__name__} does not define propose(context_ids, k) -> specdec.Draft")
    if drafter.name == Drafter.name:  # a user's drafter that does not name itself (Stats.method)
        drafter.name = info.name
    return drafter


def register_method(info: MethodInfo, *, replace: bool = False) -> MethodInfo:
    """Make ``info`` available under its name and aliases (``replace=True`` to override one)."""
    clash = _name_clash(info, replace)
    if clash is not None:
        reason, overridable = clash
        raise SpecdecError(reason + (" (pass replace=True to override it)" if overridable else ""))
    _METHODS[info.name] = info
    return info


def _name_clash(info: MethodInfo, replace: bool) -> tuple[str, bool] | None:
    """Why ``info`` cannot be registered under its name and aliases, and whether ``replace=True`` would allow it; None:
    it can (one rule for :func:`register_method`'s error and a plugin's warning)."""
    for name in (info.name, *info.aliases):
        key = _key(name)
        existing = _find(key)
        if existing is not None and existing.name != info.name and not replace:
            return f"method name {name!r} is already taken by {existing.name!r}", False
        if is_plain(key):
            return f"{name!r} means plain decoding; choose another method name", False
    if info.name in _METHODS and not replace:
        return f"method {info.name!r} is already registered", True
    return None


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def _find(key: str) -> MethodInfo | None:
    for info in tuple(_METHODS.values()):  # a copy: another thread may be registering plugins
        if key == _key(info.name) or key in (_key(a) for a in info.aliases):
            return info
    return None


def method_info(name: str) -> MethodInfo:
    """The method called ``name`` (a name or an alias; ``-`` and ``_`` alike), or a clear error."""
    info = _find(_key(name))
    if info is None and not _plugins_loaded:
        load_plugins()
        info = _find(_key(name))
    if info is None and _key(name) in _PLUGIN_FAILURES:  # the warning scrolled by long before the name was used
        raise SpecdecError(f"unknown speculative method {name!r}: {_PLUGIN_FAILURES[_key(name)]}")
    if info is None:
        raise SpecdecError(f"unknown speculative method {name!r}; available: {', '.join(method_names())}")
    return info


def is_plain(name: str) -> bool:
    """Does this user-typed method name mean plain decoding (``ar``, ``plain``, ``none``)?"""
    return _key(name) in PLAIN_NAMES


def resolve_method(name: str | None) -> str | None:
    """A user-typed method name → the registered name; None for plain decoding (``ar``, ``plain``)."""
    if name is not None and not isinstance(name, str):
        raise SpecdecError(f"a method is named by a string (see `specdec methods`), got {name!r}")
    if name is None or is_plain(name):
        return None
    return method_info(name).name


def method_names() -> list[str]:
    load_plugins()
    return sorted(_METHODS)


def plugin_sources() -> dict[str, str]:
    """The methods installed packages' entry points registered, each with its package's name."""
    load_plugins()
    return dict(_PLUGIN_SOURCES)


def all_methods() -> list[MethodInfo]:
    return [_METHODS[name] for name in method_names()]


def needs_draft_model(method: str | None) -> bool:
    return method is not None and method_info(method).needs_draft_model


def readers_of(option: str) -> list[str]:
    """The registered methods that read the SpecConfig field ``option`` (``MethodInfo.options``)."""
    return [info.name for info in all_methods() if option in info.options]


def unread_options(method: str | None, values: dict[str, object]) -> list[tuple[str, list[str]]]:
    """Of ``values`` (SpecConfig field → value), those set away from SpecConfig's default that ``method`` (a registered
    name; None: plain decoding) does not read, each with the methods that do. One rule for the CLI's warnings about
    flags and the library's about options."""
    defaults = SpecConfig()
    read = set(method_info(method).options) if method is not None else set()
    return [(option, readers_of(option)) for option, value in values.items()
            if option not in read and value != getattr(defaults, option)]


for _module in (draft_model, draft_suffix, prompt_lookup, suffix, retrieval, layer_skip, eagle, medusa):
    for _info in _module.METHODS:
        register_method(_info)
