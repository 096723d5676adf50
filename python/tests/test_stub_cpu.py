"""The native module's type stub (python/megamoe/_megamoe.pyi) against the module itself: it is
in the installed package, names exactly the functions, classes, methods and properties the
module exports, and gives each function the module's parameters (names, kinds, defaults). A
change to the extension's Python surface fails here until the stub follows it."""

import ast
import importlib.resources
import inspect
import types

import pytest

from megamoe import _megamoe

STUB = importlib.resources.files("megamoe") / "_megamoe.pyi"


def stub_tree():
    return ast.parse(STUB.read_text())


def exported(names):
    """The module's or a class's own public names (and the version)."""
    return {n for n in names if not n.startswith("__") or n == "__version__"}


def decorators(node):
    return {d.id for d in node.decorator_list if isinstance(d, ast.Name)}


def stub_parameters(fn):
    """(name, kind, default) of a stub function's parameters, as inspect names the kinds."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [
        ast.literal_eval(d) for d in a.defaults
    ]
    params = [(p.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, d) for p, d in zip(positional, defaults)]
    params += [
        (p.arg, inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty if d is None else ast.literal_eval(d))
        for p, d in zip(a.kwonlyargs, a.kw_defaults)
    ]
    return params


def runtime_parameters(obj):
    return [(p.name, p.kind, p.default) for p in inspect.signature(obj).parameters.values()]


def test_the_stub_ships_in_the_package():
    assert STUB.is_file(), f"{STUB} is not in the installed package"


def test_the_stub_names_what_the_module_exports():
    tree = stub_tree()
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    assert defined == exported(dir(_megamoe))


def top_level_functions():
    return [n for n in stub_tree().body if isinstance(n, ast.FunctionDef)]


def classes():
    return [n for n in stub_tree().body if isinstance(n, ast.ClassDef)]


@pytest.mark.parametrize("fn", top_level_functions(), ids=lambda f: f.name)
def test_each_function_has_the_modules_parameters(fn):
    assert stub_parameters(fn) == runtime_parameters(getattr(_megamoe, fn.name))


@pytest.mark.parametrize("cls", classes(), ids=lambda c: c.name)
def test_each_class_has_the_modules_members_and_parameters(cls):
    native = getattr(_megamoe, cls.name)
    members = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    init = members.pop("__init__", None)
    assert set(members) == exported(vars(native)), cls.name
    # A constructor where the class has one (Rust's #[new]), with its parameters.
    if native.__text_signature__ is None:
        assert init is None, f"{cls.name} cannot be constructed from Python"
    else:
        assert init is not None, f"{cls.name}.__init__ is missing"
        assert stub_parameters(init)[1:] == runtime_parameters(native)
    for name, fn in members.items():
        member = inspect.getattr_static(native, name)
        is_property = "property" in decorators(fn)
        assert is_property == inspect.isgetsetdescriptor(member), f"{cls.name}.{name}: property or not"
        if is_property:
            continue
        static = "staticmethod" in decorators(fn)
        assert static == isinstance(member, (staticmethod, types.BuiltinFunctionType)), (
            f"{cls.name}.{name}: static or not"
        )
        stub, runtime = stub_parameters(fn), runtime_parameters(getattr(native, name))
        if not static:
            stub, runtime = stub[1:], runtime[1:]  # self
        assert stub == runtime, f"{cls.name}.{name}"
