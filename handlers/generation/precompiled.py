"""A language model's forward compiled whole, a graph for each kind of step, and those graphs saved
with what Dynamo made of the model's Python code: a worker's start loads them instead of tracing the
model again (the build saves them into the archive: compiled.py).

    graphs, said = load(directory, model)
    model.forward = Forward(model, options, graphs)     # a worker; kinds not loaded compile at their first step
    saved = model.forward.save(directory)                # the build, after a worker's start

With the Inductor cache's files from the archive, a start still traced the model's Python code at
every start, for each graph: Qwen2.5-0.5B's shape spent 37 s of a 48 s warm-up in Dynamo (one
start, 2 graphs, 24 layers, 2-core Intel Xeon). torch's ahead-of-time compile of a whole graph
(`aot_compile`, an experimental API of torch 2.13) keeps Dynamo's result with the compiled graph,
and loads both in seconds: a tiny Qwen2's start took 3.7 s against 15 s (`make test`'s models, one
start each, 2-core AMD EPYC: a gap far wider than the 15-25 % that starts vary by).

A kind of step is one graph: a decode step (rows of one token), a prompt's part (one row of
tokens), or both at once (`mixed`, attention.py); the kit sends each kind few shapes (runner.py).
A model whose forward Dynamo cannot take whole (a graph break) or whose graph torch cannot save is
compiled as before (`compile_forward`), and says why. Only the shape guards are kept with a saved
graph: everything else Dynamo guards on (the model's classes, configuration and settings) is fixed
by the archive the graph ships in, and its directory's name holds what could differ at a start
(torch, Python and transformers versions, the CPU: compiled.py). A step whose shapes fail the
saved guards is computed by a graph compiled for it, which the worker logs as a recompile.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from handlers.generation import native

log = logging.getLogger(__name__)

SUFFIX = ".graph"

# Inductor's options for one kind of step, beside the model's (compiled.py). A decode step's graph
# runs in C++ (Inductor's cpp_wrapper): its Python wrapper made ~1,000 calls a step (kernels,
# operators, size checks, views) while the other threads waited. Qwen2.5-0.5B's shape in bf16 on
# a 2-core AMX Xeon, the three decode graphs loaded in one process and taken in turns step by
# step (medians of 600 steps, two processes): one row 59.8 / 63.4 ms with Python's wrapper and the
# layers through kit::linear, 57.8 / 61.8 with them held by the library (linears.py), 53.7 / 56.6
# with both; 16 rows 82.2 / 86.2, 79.3 / 83.7, 74.6 / 78.6. The other kinds keep Python's: their
# steps are a prompt's arithmetic, and the mixed graph's C++ wrapper compiled 20 s longer.
KIND_OPTIONS = {"decode": {"cpp_wrapper": True}}


def step_kind(kwargs: dict) -> str:
    """Which graph computes a forward of these arguments (runner.py's three kinds of step)."""
    if "mixed" in kwargs:
        return "mixed"
    return "decode" if kwargs["input_ids"].shape[1] == 1 else "part"


def wrapped(model: nn.Module) -> dict[str, Callable]:
    """The model's forward and the functions its decorators wrap (transformers' `can_return_tuple`
    and the like). Dynamo's saved code refers to the innermost, which its module does not name
    (the module holds the decorated one), so it cannot be saved by name: it is handed to the save
    and the load as the same object of this process's model class."""
    found, function = {}, type(model).forward
    while function is not None:
        found[f"forward-{len(found)}"] = function
        function = getattr(function, "__wrapped__", None)
    return found


def shape_guards_only(entries) -> list[bool]:
    """The guards a whole graph keeps: its shapes' (see above)."""
    return [entry.guard_type == "SHAPE_ENV" for entry in entries]


def summary(error: Exception) -> str:
    first = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first}"


class Forward:
    """model.forward: each kind of step's whole graph, loaded or compiled at its first call."""

    def __init__(self, model: nn.Module, options: dict, loaded: dict | None = None):
        self.model, self.options = model, options  # Inductor's (compiled.py)
        self.original = model.forward
        self.graphs = dict(loaded or {})  # kind: a whole graph (torch's AOTCompiledFunction)
        self.loaded_kinds = frozenset(self.graphs)
        self.traced: Callable | None = None
        self.fallbacks: dict[str, str] = {}  # kind: why it is computed by the traced forward
        self.unguarded: set[str] = set()  # kinds a step's shapes took past their whole graph (said once)

    def traces(self, kinds: Iterable[str]) -> bool:
        """Whether a step of these kinds may trace the model: one not loaded whole, or one whose
        shapes failed a loaded graph's guards (computed by the traced forward since)."""
        return self.traced is not None or not self.loaded_kinds.issuperset(kinds)

    def __call__(self, **kwargs):
        kind = step_kind(kwargs)
        graph = self.graphs.get(kind)
        if graph is None and kind not in self.fallbacks:
            graph = self._compile(kind, kwargs)
        if graph is not None and graph.guard_check(self.model, **kwargs):
            return graph(self.model, **kwargs)
        if graph is not None and kind not in self.unguarded:
            self.unguarded.add(kind)
            log.warning("a %s step's shapes fail its whole graph's guards: computed by a graph compiled for it", kind)
        if self.traced is None:  # compiled graph by graph, as without whole graphs (Dynamo's guards)
            self.traced = torch.compile(self.original, dynamic=True, options=self.options)
        return self.traced(**kwargs)

    def _compile(self, kind: str, kwargs: dict):
        options = {**self.options, **KIND_OPTIONS.get(kind, {}), "guard_filter_fn": shape_guards_only}
        start = time.perf_counter()
        # Dynamo saves the objects its guards were built from, the model's own attributes among
        # them: this forward (which holds the graphs) is not one of the model's.
        own = self.model.__dict__.pop("forward", None)
        try:
            compiled = torch.compile(self.original, dynamic=True, fullgraph=True, options=options)
            graph = compiled.aot_compile(((), kwargs))
        except Exception as error:  # noqa: BLE001 - any failure to take the model whole has the same remedy
            self.fallbacks[kind] = summary(error)
            log.info("the %s step cannot be compiled whole (%s): compiled graph by graph", kind, self.fallbacks[kind])
            return None
        finally:
            if own is not None:
                self.model.forward = own
        graph.disable_guard_check()  # checked by __call__, once
        self.graphs[kind] = graph
        log.info("the %s step compiled whole in %.1fs", kind, time.perf_counter() - start)
        return graph

    def save(self, directory: Path) -> list[str]:
        """Each whole graph compiled here into directory (<kind>.graph); the kinds saved. Not one
        whose guards some step's shapes failed: a worker that loads a graph computes a single
        prompt before READY (warm_up.py), trusting the sizes of this process's warm-up to pass."""
        directory.mkdir(parents=True, exist_ok=True)
        saved = []
        for kind, graph in self.graphs.items():
            if kind in self.unguarded:
                log.info(
                    "the %s step's whole graph failed its guards at some sizes: not saved, workers compile it", kind
                )
                continue
            try:
                portable(graph).save_compiled_function(str(directory / f"{kind}{SUFFIX}"), wrapped(self.model))
            except Exception as error:  # noqa: BLE001 - a graph that cannot be saved is compiled at a start
                log.info("the %s step's whole graph cannot be saved (%s): workers compile it", kind, summary(error))
                continue
            saved.append(kind)
        return saved


def portable(graph):
    """The graph with the modules Dynamo's code reaches by an alias of this process (a name
    holding the module's id, set in the traced function's globals) saved by their import names."""
    env, known = graph._artifacts.runtime_env, graph._extra_globals or {}
    modules = {
        name: known[name]
        for name in env.external_refs
        if name not in env.used_globals and isinstance(known.get(name), types.ModuleType)
    }
    graph._artifacts.runtime_env = dataclasses.replace(env, used_globals={**env.used_globals, **modules})
    return graph


def load(directory: Path, model: nn.Module) -> tuple[dict, str]:
    """The whole graphs saved in directory, by kind, and what was found, in a phrase for the log."""
    files = sorted(directory.glob(f"*{SUFFIX}")) if directory.is_dir() else []
    if files:
        native.library()  # the graphs call the kit's kernels (torch.ops.kit_rows): loaded before them
    graphs, refused = {}, []
    for path in files:
        try:
            with path.open("rb") as file:
                graph = torch.compiler.load_compiled_function(file, external_data=wrapped(model))
        except Exception as error:  # noqa: BLE001 - a graph that does not load is compiled again
            refused.append(f"{path.stem}: {summary(error)}")
            continue
        graph.disable_guard_check()
        graphs[path.stem] = graph
    said = f"{len(graphs)} whole graphs loaded ({', '.join(sorted(graphs)) or 'none'})"
    return graphs, said + (f"; not loaded: {'; '.join(refused)}" if refused else "")
